//! Faults of the real servers while `spate` runs: a Kafka broker paused
//! (SIGSTOP) for 20 s and then restarted with its data, under
//! `spate run --exactly-once` and under a three-member application; an S3
//! server stopped for 20 s under the demo on an `s3://` checkpoint. In each
//! the job says so in its log, carries on once the server is back, and its
//! output is exact: every input record counted once, none lost, no output
//! written twice.
//!
//! Each test starts a server of its own (`cargo xtask kafka|s3 start
//! --instance NAME`), never the one the other tests share, through the
//! xtask binary that `cargo xtask test` names in `SPATE_XTASK`. By hand:
//! `cargo build -p xtask`, then
//! `SPATE_XTASK=<target>/debug/xtask cargo test -p spate-cli --test faults`.
//! Without it every test fails saying so; none passes untested.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::Value;

const SPATE: &str = env!("CARGO_BIN_EXE_spate");
/// How long the paused or stopped server stays away, as the issue prescribes.
const OUTAGE: Duration = Duration::from_secs(20);
/// How long a test waits for the job to do something before it fails.
const GIVE_UP: Duration = Duration::from_secs(180);

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// A server of the test's own, run by xtask; stopped (data removed) when dropped.
struct Server {
    kind: &'static str,
    instance: String,
    /// The Kafka bootstrap address or the S3 endpoint.
    address: String,
    pid: u32,
}

impl Server {
    fn xtask() -> PathBuf {
        match std::env::var_os("SPATE_XTASK") {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => panic!(
                "this test starts, pauses and restarts servers of its own with the xtask binary: run it through \
                 `cargo xtask test`, or `cargo build -p xtask` and set SPATE_XTASK=<target dir>/debug/xtask"
            ),
        }
    }

    /// Runs `xtask <kind> <args> --instance <instance>`; its stdout, which must end in success.
    fn xtask_run(kind: &str, instance: &str, args: &[&str]) -> String {
        let output = Command::new(Self::xtask()).arg(kind).args(args).args(["--instance", instance]).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "xtask {kind} {args:?} failed ({}):\n{stdout}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }

    /// The address and pid of the last `… at <address> (pid <pid>)` line.
    fn parse(stdout: &str) -> (String, u32) {
        let line = stdout.lines().rev().find(|l| l.contains(" at ") && l.contains(" (pid ")).unwrap_or_else(|| {
            panic!("xtask printed no address and pid:\n{stdout}");
        });
        let after = line.split(" at ").nth(1).unwrap();
        let (address, rest) = after.split_once(" (pid ").unwrap();
        let pid = rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap();
        (address.to_string(), pid)
    }

    fn start(kind: &'static str) -> Server {
        let instance = unique(&format!("fault-{kind}"));
        let (address, pid) = Self::parse(&Self::xtask_run(kind, &instance, &["start"]));
        Server { kind, instance, address, pid }
    }

    fn signal(&self, name: &str) {
        assert!(Command::new("kill").args([name, &self.pid.to_string()]).status().unwrap().success());
    }

    /// Stops the server, leaves it down for `down`, starts it again on its data.
    fn restart(&mut self, down: Duration) {
        let seconds = down.as_secs().to_string();
        let stdout = Self::xtask_run(self.kind, &self.instance, &["restart", "--down-seconds", &seconds]);
        let (address, pid) = Self::parse(&stdout);
        assert_eq!(address, self.address, "the server came back elsewhere");
        self.pid = pid;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.pid.to_string()]).status();
        let _ = Command::new(Self::xtask()).args([self.kind, "stop", "--instance", &self.instance]).output();
    }
}

/// A `spate` process, its stderr in a file; killed if the test ends before
/// it was stopped, its log printed when the test fails.
struct Job {
    child: Option<Child>,
    name: String,
    log: tempfile::NamedTempFile,
}

impl Job {
    fn spawn(mut command: Command, name: &str) -> Job {
        let log = tempfile::NamedTempFile::new().unwrap();
        command.env_remove("RUST_LOG").stdout(Stdio::null()).stderr(log.reopen().unwrap());
        Job { child: Some(command.spawn().unwrap()), name: name.to_string(), log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// Fails when the process ended: it must carry on through the outage.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
            panic!("{} ended ({status}) while it should run", self.name);
        }
    }

    /// SIGTERM, then the exit code, which must be 0.
    fn stop_gracefully(&mut self) {
        let mut child = self.child.take().unwrap();
        assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{} did not stop gracefully: {status}", self.name);
    }

    /// The job's batch, transaction and outage counters from `/metrics`,
    /// or why they could not be read.
    fn progress_metrics(&self) -> String {
        let Some(addr) = self.logged_metrics_addr() else {
            return "no metrics address in the log".to_string();
        };
        let wanted =
            ["spate_last_committed_batch", "spate_batches_committed_total", "spate_kafka_", "spate_backpressure_rate"];
        let text = match try_get(&addr, "/metrics") {
            Ok(text) => text,
            Err(e) => return format!("/metrics not read: {e}"),
        };
        let lines: Vec<&str> =
            text.lines().filter(|l| !l.starts_with('#') && wanted.iter().any(|w| l.starts_with(w))).collect();
        lines.join("\n")
    }

    /// The address of `/metrics`, if the job has printed its line yet.
    fn logged_metrics_addr(&self) -> Option<String> {
        let log = self.log();
        let rest = log.lines().find_map(|l| l.trim().strip_prefix("metrics: http://"))?;
        Some(rest.trim_end_matches("/metrics").to_string())
    }

    /// The address of `/metrics`, from the line the job prints at start.
    fn metrics_addr(&mut self) -> String {
        let deadline = Instant::now() + GIVE_UP;
        loop {
            if let Some(addr) = self.logged_metrics_addr() {
                return addr;
            }
            self.assert_running();
            assert!(Instant::now() < deadline, "{} printed no metrics address", self.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            // Every line but the routine one a batch, then the last lines whole.
            let text = self.log();
            let lines: Vec<&str> = text.lines().collect();
            let events: Vec<&str> = lines.iter().copied().filter(|l| !l.contains("batch committed")).collect();
            let tail = &lines[lines.len().saturating_sub(60)..];
            eprintln!(
                "---- {} log, {} lines, all but each batch's commit ----\n{}",
                self.name,
                lines.len(),
                events.join("\n")
            );
            eprintln!("---- {} log, last {} lines ----\n{}", self.name, tail.len(), tail.join("\n"));
        }
    }
}

/// A `GET` of `/metrics` with a plain socket; the body.
fn metrics(addr: &str) -> String {
    get(addr, "/metrics")
}

/// A `GET` of `path` with a plain socket; the body.
fn get(addr: &str, path: &str) -> String {
    try_get(addr, path).unwrap()
}

/// [`get`], its failure returned: for reports made while a test fails.
fn try_get(addr: &str, path: &str) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// The sum of every series of the counter `name` in a `/metrics` text.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn create_topics(brokers: &str, topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let new: Vec<NewTopic<'_>> =
        topics.iter().map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1))).collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for result in runtime.block_on(admin.create_topics(&new, &AdminOptions::new())).unwrap() {
        result.unwrap();
    }
}

/// Produces `(partition, timestamp, line)`s and checks every one landed.
fn produce(brokers: &str, topic: &str, partitions: i32, lines: &[(i32, Option<i64>, String)]) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", brokers).set("enable.idempotence", "true").create().unwrap();
    for (partition, ts, line) in lines {
        let mut record = BaseRecord::<(), String>::to(topic).payload(line).partition(*partition);
        if let Some(ts) = ts {
            record = record.timestamp(*ts);
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let landed: i64 =
        (0..partitions).map(|p| producer.client().fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap().1).sum();
    assert_eq!(landed, lines.len() as i64, "the broker took {landed} of the {} lines", lines.len());
}

/// The committed records of a topic, read as they come.
struct Committed {
    consumer: BaseConsumer,
    topic: String,
    values: Vec<Value>,
}

impl Committed {
    fn new(brokers: &str, topic: &str) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", unique("reader"))
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        Committed { consumer, topic: topic.to_string(), values: Vec::new() }
    }

    /// Takes what arrived; a client error while the broker is away is not the test's failure.
    fn poll(&mut self) {
        while let Some(message) = self.consumer.poll(Duration::from_millis(100)) {
            if let Ok(message) = message {
                self.values.push(serde_json::from_slice(message.payload().unwrap_or_default()).unwrap());
            }
        }
    }

    /// Polls until `done` holds, failing after [`GIVE_UP`]; `job` must keep running meanwhile.
    fn wait_until(&mut self, jobs: &mut [&mut Job], what: &str, done: impl Fn(&Committed) -> bool) {
        let deadline = Instant::now() + GIVE_UP;
        while !done(self) {
            for job in jobs.iter_mut() {
                job.assert_running();
            }
            if Instant::now() >= deadline {
                panic!(
                    "{what}: not reached in {GIVE_UP:?}; {} records read\n{}",
                    self.values.len(),
                    self.stall_report(jobs)
                );
            }
            self.poll();
        }
    }

    /// What tells a stalled job from a reader held back by an open
    /// transaction: the topic's offsets as written, against what a
    /// `read_committed` reader got, and each job's progress counters.
    fn stall_report(&self, jobs: &[&mut Job]) -> String {
        let written: Vec<String> = match self.consumer.fetch_metadata(Some(&self.topic), Duration::from_secs(10)) {
            Ok(metadata) => metadata
                .topics()
                .iter()
                .flat_map(|topic| topic.partitions())
                .map(|p| match self.consumer.fetch_watermarks(&self.topic, p.id(), Duration::from_secs(10)) {
                    Ok((_, high)) => format!("partition {}: high watermark {high}", p.id()),
                    Err(e) => format!("partition {}: {e}", p.id()),
                })
                .collect(),
            Err(e) => vec![format!("no metadata: {e}")],
        };
        let mut report = format!("output topic {}: {}", self.topic, written.join(", "));
        for job in jobs {
            report.push_str(&format!("\n{} progress:\n{}", job.name, job.progress_metrics()));
        }
        report
    }
}

/// The input of the `--exactly-once` test: record `i` is the one word `r<i>`.
fn record_word(i: usize) -> String {
    format!("r{i:05}")
}

/// The window's record ids (each word `r<i>` and its count).
fn window_ids(value: &Value) -> BTreeMap<usize, u64> {
    value["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap()[1..].parse().unwrap(), p[1].as_u64().unwrap()))
        .collect()
}

/// Waits until the log holds a line with `needle`.
fn wait_for_log(job: &mut Job, needle: &str) {
    let deadline = Instant::now() + GIVE_UP;
    while !job.log().contains(needle) {
        job.assert_running();
        assert!(Instant::now() < deadline, "{}: no log line with {needle:?}", job.name);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The warning the Kafka clients give when they lose the broker.
const KAFKA_OUTAGE_LOG: &str = "the Kafka broker is unreachable or not ready";
/// The counter of those client errors.
const KAFKA_OUTAGE_METRIC: &str = "spate_kafka_broker_unavailable_total";

#[test]
fn run_exactly_once_carries_on_through_a_paused_then_restarted_broker_and_counts_each_record_once() {
    let mut broker = Server::start("kafka");
    let brokers = broker.address.clone();
    let (input, output) = (unique("fault-in"), unique("fault-out"));
    create_topics(&brokers, &[(&input, 1), (&output, 1)]);
    // One word a record, each its own: a window's words are the records it
    // counted, so a record counted twice shows as a count of 2, a lost one
    // as a gap in the ids.
    const RECORDS: usize = 800;
    let lines: Vec<(i32, Option<i64>, String)> = (0..RECORDS).map(|i| (0, None, record_word(i))).collect();
    produce(&brokers, &input, 1, &lines);

    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let mut command = Command::new(SPATE);
    command.args(["-v", "run", "--kafka", &brokers, "--topic", &input, "--output-topic", &output, "--exactly-once"]);
    // 20 records a second: the backlog lasts through the outage and after.
    command.args(["--batch-ms", "200", "--max-rate-per-partition", "20", "--top", "1000", "--quiet"]);
    command.args(["--checkpoint", checkpoint.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0"]);
    let mut job = Job::spawn(command, "spate run");
    let addr = job.metrics_addr();
    let mut out = Committed::new(&brokers, &output);
    out.wait_until(&mut [&mut job], "the first windows", |c| !c.values.is_empty());

    broker.signal("-STOP");
    std::thread::sleep(OUTAGE);
    broker.signal("-CONT");
    broker.restart(Duration::ZERO);
    wait_for_log(&mut job, KAFKA_OUTAGE_LOG);
    assert!(counter(&metrics(&addr), KAFKA_OUTAGE_METRIC) > 0.0, "{}", metrics(&addr));

    // The reader's client lost the broker too: a new one reads everything again.
    let mut out = Committed::new(&brokers, &output);
    let last = RECORDS - 1;
    out.wait_until(&mut [&mut job], "a window holding the last record", |c| {
        c.values.iter().any(|v| window_ids(v).contains_key(&last))
    });
    job.stop_gracefully();

    let batches: Vec<u64> = out.values.iter().map(|v| v["batch"].as_u64().unwrap()).collect();
    assert!(batches.windows(2).all(|w| w[0] < w[1]), "a window was written twice or out of order: {batches:?}");
    let mut seen = BTreeSet::new();
    let mut previous: Option<(usize, usize)> = None;
    for value in &out.values {
        let ids = window_ids(value);
        let Some((&first, &end)) = ids.keys().next().zip(ids.keys().next_back()) else { continue };
        assert!(ids.values().all(|&n| n == 1), "a record counted twice in window {value}");
        assert_eq!(ids.len(), end - first + 1, "records missing inside window {value}");
        if let Some((before_first, before_end)) = previous {
            assert!(first >= before_first && end >= before_end, "a window went back: {value}");
        }
        previous = Some((first, end));
        seen.extend(ids.into_keys());
    }
    let missing: Vec<usize> = (0..RECORDS).filter(|i| !seen.contains(i)).collect();
    assert!(missing.is_empty(), "records in no window: {missing:?}");
}

const WINDOW_MS: i64 = 10_000;
const PARTITIONS: i32 = 6;
const WORDS: [&str; 13] =
    ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "kiwi", "lynx", "mole"];

/// `(partition, timestamp, line)`: 90 s of event time from `base`.
fn app_lines(base: i64) -> Vec<(i32, Option<i64>, String)> {
    (0..1_800i64)
        .map(|i| {
            let line: Vec<&str> = (0..4).map(|j| WORDS[((i * 31 + j * 17 + i * i / 7) % 13) as usize]).collect();
            (((i * 5 + i / 3) % i64::from(PARTITIONS)) as i32, Some(base + i * 50), line.join(" "))
        })
        .collect()
}

/// Each (word, window start)'s count, for windows ending by `until`.
fn reference(lines: &[(i32, Option<i64>, String)], until: i64) -> BTreeMap<(String, i64), u64> {
    let mut counts = BTreeMap::new();
    for (_, ts, line) in lines {
        let start = ts.unwrap().div_euclid(WINDOW_MS) * WINDOW_MS;
        if start + WINDOW_MS <= until {
            for word in line.split_whitespace() {
                *counts.entry((word.to_string(), start)).or_default() += 1;
            }
        }
    }
    counts
}

/// The latest revision of each window count.
fn latest_counts(values: &[Value]) -> BTreeMap<(String, i64), u64> {
    let mut latest: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
    for v in values {
        let key = (v["word"].as_str().unwrap().to_string(), v["windowStart"].as_i64().unwrap());
        let (revision, count) = (v["revision"].as_u64().unwrap(), v["count"].as_u64().unwrap());
        let entry = latest.entry(key).or_insert((revision, count));
        if revision >= entry.0 {
            *entry = (revision, count);
        }
    }
    latest.into_iter().map(|(k, (_, count))| (k, count)).collect()
}

/// One `spate run --app` member on `brokers`.
fn member(brokers: &str, app: &str, input: &str, output: &str, checkpoint: &Path, id: &str) -> Job {
    let mut command = Command::new(SPATE);
    command.args(["run", "--app", app, "--member-id", id, "--kafka", brokers, "--topic", input]);
    command.args(["--output-topic", output, "--checkpoint", checkpoint.to_str().unwrap()]);
    // Batches of a second: the outage leaves each task few batches to catch up on.
    command.args(["--batch-ms", "1000", "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "1000"]);
    // 30 records a second a partition: the 1 200 words each partition of the
    // application's internal topic gets take 40 s, through the outage.
    command.args(["--max-rate-per-partition", "30", "--window-ms", "10000", "--slide-ms", "10000"]);
    command.args(["--out-of-orderness-ms", "2000", "--transaction-timeout-ms", "5000", "--top", "3"]);
    // One address serves the member's /metrics and its page of tasks.
    command.args(["--metrics-addr", "127.0.0.1:0", "--ui", "127.0.0.1:0", "-v"]);
    Job::spawn(command, &format!("member {id}"))
}

#[test]
fn a_three_member_application_carries_on_through_a_paused_then_restarted_broker_and_counts_exactly() {
    let mut broker = Server::start("kafka");
    let brokers = broker.address.clone();
    let (input, output, app) = (unique("fault-app-in"), unique("fault-app-out"), unique("fault-app"));
    create_topics(&brokers, &[(&input, PARTITIONS), (&output, 1), (&format!("{output}-top"), 1)]);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = (now - 300_000) / WINDOW_MS * WINDOW_MS;
    let lines = app_lines(base);
    produce(&brokers, &input, PARTITIONS, &lines);
    let expected = reference(&lines, base + 80_000);
    let dir = tempfile::tempdir().unwrap();

    let mut members: Vec<Job> =
        ["m1", "m2", "m3"].iter().map(|id| member(&brokers, &app, &input, &output, dir.path(), id)).collect();
    let mut counts = Committed::new(&brokers, &output);
    {
        let mut jobs: Vec<&mut Job> = members.iter_mut().collect();
        counts.wait_until(&mut jobs, "the first counts", |c| !c.values.is_empty());
    }

    broker.signal("-STOP");
    std::thread::sleep(OUTAGE);
    broker.signal("-CONT");
    broker.restart(Duration::ZERO);
    for member in &mut members {
        wait_for_log(member, KAFKA_OUTAGE_LOG);
        let addr = member.metrics_addr();
        assert!(counter(&metrics(&addr), KAFKA_OUTAGE_METRIC) > 0.0, "{}: {}", member.name, metrics(&addr));
    }

    let mut counts = Committed::new(&brokers, &output);
    {
        let mut jobs: Vec<&mut Job> = members.iter_mut().collect();
        counts.wait_until(&mut jobs, "every count", |c| {
            let got = latest_counts(&c.values);
            expected.iter().all(|(k, v)| got.get(k) == Some(v))
        });
    }
    let mut once = BTreeSet::new();
    for v in &counts.values {
        let key = (v["word"].to_string(), v["windowStart"].as_i64(), v["revision"].as_u64());
        assert!(once.insert(key.clone()), "written twice: {key:?}");
    }
    // Each member's figures are labelled by task, and its page lists its tasks.
    let labelled: usize = members
        .iter_mut()
        .map(|m| {
            let text = metrics(&m.metrics_addr());
            text.lines().filter(|l| l.starts_with("spate_batches_committed_total{") && l.contains("task=\"")).count()
        })
        .sum();
    assert!(labelled >= PARTITIONS as usize, "fewer labelled task series than the input's partitions: {labelled}");
    let status = get(&members[0].metrics_addr(), "/api/status");
    assert!(status.contains("\"tasks\"") && status.contains("\"member\":\"m1\""), "{status}");
    for member in &mut members {
        member.stop_gracefully();
    }
}

/// The demo's seed, which [`spate_runtime::demo::verify_output`] checks the output against.
const SEED: u64 = 7;

/// The warning the checkpoint's store gives when S3 does not answer.
const S3_OUTAGE_LOG: &str = "the object store is unreachable; retrying";
/// The counter of those failed requests.
const S3_OUTAGE_METRIC: &str = "spate_object_store_unavailable_total";

#[test]
fn the_demo_on_s3_carries_on_through_a_stopped_server_and_writes_each_batch_once() {
    let mut server = Server::start("s3");
    let location = format!("s3://spate-test/faults/{}", unique("demo"));
    let wal = tempfile::tempdir().unwrap();
    let secret = wal.path().join("secret");
    std::fs::write(&secret, "spate-test-secret").unwrap();
    let mut command = Command::new(SPATE);
    command.args(["demo", "--checkpoint", &location, "--wal-dir", wal.path().to_str().unwrap()]);
    command.args(["--batch-ms", "200", "--rate", "2000", "--seed", &SEED.to_string(), "--quiet"]);
    command.args(["--s3-endpoint", &server.address, "--s3-region", "us-east-1", "--s3-access-key-id", "spate-test"]);
    command.args(["--s3-secret-access-key-file", secret.to_str().unwrap(), "--s3-allow-http"]);
    command.args(["--metrics-addr", "127.0.0.1:0"]);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| n.starts_with("AWS_")) {
            command.env_remove(name);
        }
    }
    let mut job = Job::spawn(command, "spate demo");
    let addr = job.metrics_addr();
    let committed = |addr: &str| counter(&metrics(addr), "spate_batches_committed_total");
    let deadline = Instant::now() + GIVE_UP;
    while committed(&addr) < 3.0 {
        job.assert_running();
        assert!(Instant::now() < deadline, "the demo committed no batch");
        std::thread::sleep(Duration::from_millis(100));
    }

    server.restart(OUTAGE);
    wait_for_log(&mut job, S3_OUTAGE_LOG);
    assert!(counter(&metrics(&addr), S3_OUTAGE_METRIC) > 0.0, "{}", metrics(&addr));
    let before = committed(&addr);
    let deadline = Instant::now() + GIVE_UP;
    while committed(&addr) < before + 10.0 {
        job.assert_running();
        assert!(Instant::now() < deadline, "the demo committed nothing after the server came back");
        std::thread::sleep(Duration::from_millis(100));
    }
    job.stop_gracefully();

    let check = spate_runtime::demo::verify_output(&wal.path().join("output"), SEED).unwrap();
    assert!(check.batches > 10 && check.records > 0, "{check:?}");
}
