//! `spate run --app` against a real broker: several member processes share
//! one application. Members are killed with SIGKILL, started, and stopped
//! gracefully while they run; the counts they commit (read with
//! `read_committed`) equal a reference computed from the input, none lost
//! or counted twice, and each window's top words follow. Needs a broker:
//! `cargo xtask test` starts one, or `cargo xtask kafka start` then
//! `SPATE_KAFKA_BROKERS=127.0.0.1:<port> cargo test -p spate-cli --test app`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use serde_json::Value;

fn brokers() -> String {
    match std::env::var("SPATE_KAFKA_BROKERS") {
        Ok(b) if !b.trim().is_empty() => b,
        _ => panic!(
            "this test needs a Kafka broker: run through `cargo xtask test` or set SPATE_KAFKA_BROKERS \
             (e.g. after `cargo xtask kafka start`)"
        ),
    }
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn create_topics(topics: &[(&str, i32)]) {
    create_topics_with(topics, &[]);
}

/// Creates `topics` with the topic settings `config`.
fn create_topics_with(topics: &[(&str, i32)], config: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|(name, partitions)| {
            config.iter().fold(NewTopic::new(name, *partitions, TopicReplication::Fixed(1)), |t, (k, v)| t.set(k, v))
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for result in runtime.block_on(admin.create_topics(&new, &AdminOptions::new())).unwrap() {
        result.unwrap();
    }
}

const WINDOW_MS: i64 = 10_000;
const PARTITIONS: i32 = 6;
const WORDS: [&str; 13] =
    ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen", "ibis", "jay", "kiwi", "lynx", "mole"];

/// `(partition, timestamp, line)`: 90 s of event time from `base`, words
/// spread over the partitions in no order of theirs.
fn lines(base: i64) -> Vec<(i32, i64, String)> {
    (0..1_800i64)
        .map(|i| {
            let line: Vec<&str> = (0..4).map(|j| WORDS[((i * 31 + j * 17 + i * i / 7) % 13) as usize]).collect();
            (((i * 5 + i / 3) % i64::from(PARTITIONS)) as i32, base + i * 50, line.join(" "))
        })
        .collect()
}

fn produce(topic: &str, lines: &[(i32, i64, String)]) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("enable.idempotence", "true").create().unwrap();
    for (partition, ts, line) in lines {
        let record = BaseRecord::<(), String>::to(topic).payload(line).partition(*partition).timestamp(*ts);
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    // A delivery the broker refused is not an error of flush: count what landed.
    let partitions = lines.iter().map(|(p, _, _)| *p + 1).max().unwrap_or(0);
    let landed: i64 =
        (0..partitions).map(|p| producer.client().fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap().1).sum();
    assert_eq!(landed, lines.len() as i64, "the broker took {landed} of the {} lines", lines.len());
}

/// Each (word, window start)'s count, for windows ending by `until`.
fn reference(lines: &[(i32, i64, String)], until: i64) -> BTreeMap<(String, i64), u64> {
    let mut counts = BTreeMap::new();
    for (_, ts, line) in lines {
        let start = ts.div_euclid(WINDOW_MS) * WINDOW_MS;
        if start + WINDOW_MS <= until {
            for word in line.split_whitespace() {
                *counts.entry((word.to_string(), start)).or_default() += 1;
            }
        }
    }
    counts
}

/// The committed records of a topic, read as they come.
struct Committed {
    consumer: BaseConsumer,
    values: Vec<Value>,
}

impl Committed {
    fn new(topic: &str) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", unique("reader"))
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        consumer.subscribe(&[topic]).unwrap();
        Committed { consumer, values: Vec::new() }
    }

    fn poll(&mut self) {
        while let Some(message) = self.consumer.poll(Duration::from_millis(100)) {
            let payload = message.unwrap().payload().unwrap_or_default().to_vec();
            self.values.push(serde_json::from_slice(&payload).unwrap());
        }
    }

    /// The latest revision of each window count.
    fn counts(&self) -> BTreeMap<(String, i64), u64> {
        let mut latest: BTreeMap<(String, i64), (u64, u64)> = BTreeMap::new();
        for v in &self.values {
            let key = (v["word"].as_str().unwrap().to_string(), v["windowStart"].as_i64().unwrap());
            let (revision, count) = (v["revision"].as_u64().unwrap(), v["count"].as_u64().unwrap());
            let entry = latest.entry(key).or_insert((revision, count));
            if revision >= entry.0 {
                *entry = (revision, count);
            }
        }
        latest.into_iter().map(|(k, (_, count))| (k, count)).collect()
    }
}

/// A member process, killed with SIGKILL if the test ends (or fails) before
/// it was stopped, so a failed run leaves no process behind. Its log (info
/// and above) goes to a file, printed when the test fails.
struct Running {
    child: Option<Child>,
    id: String,
    log: tempfile::NamedTempFile,
}

impl Running {
    /// Starts `command` as member `id`, its stderr to the member's log.
    fn spawn(mut command: Command, id: &str) -> Running {
        let log = tempfile::NamedTempFile::new().unwrap();
        command.arg("-v").env_remove("RUST_LOG").stdout(Stdio::null()).stderr(log.reopen().unwrap());
        Running { child: Some(command.spawn().unwrap()), id: id.to_string(), log }
    }

    fn signal(&self, name: &str) {
        let pid = self.child.as_ref().map(|c| c.id().to_string()).unwrap_or_default();
        assert!(Command::new("kill").args([name, &pid]).status().unwrap().success());
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// SIGTERM, then the exit code, which must be 0.
    fn stop_gracefully(mut self) {
        self.signal("-TERM");
        let code = self.child.take().map(|mut c| c.wait().unwrap().code());
        assert_eq!(code, Some(Some(0)), "a graceful stop exits 0");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGCONT first: a stopped process cannot act on the kill otherwise.
            let _ = Command::new("kill").args(["-CONT", &child.id().to_string()]).status();
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(80)..];
            eprintln!(
                "---- member {} log, last {} of {} lines ----\n{}",
                self.id,
                tail.len(),
                lines.len(),
                tail.join("\n")
            );
        }
    }
}

/// One `spate run --app` process.
/// With the command's default lateness; late words go to `<output>-late`.
fn member(app: &str, input: &str, output: &str, checkpoint: &Path, id: &str) -> Running {
    let brokers = brokers();
    let late_topic = format!("{output}-late");
    let args = [
        "run",
        "--app",
        app,
        "--member-id",
        id,
        "--kafka",
        &brokers,
        "--topic",
        input,
        "--output-topic",
        output,
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--batch-ms",
        "200",
        "--session-timeout-ms",
        "6000",
        "--heartbeat-interval-ms",
        "1000",
        "--max-rate-per-partition",
        "150",
        "--window-ms",
        "10000",
        "--slide-ms",
        "10000",
        "--out-of-orderness-ms",
        "2000",
        "--late-topic",
        &late_topic,
        "--transaction-timeout-ms",
        "5000",
        "--top",
        "3",
    ];
    let mut command = Command::new(env!("CARGO_BIN_EXE_spate"));
    command.args(args);
    Running::spawn(command, id)
}

/// Polls until `done` holds of what was committed, failing after `limit`.
fn wait_until(committed: &mut Committed, limit: Duration, what: &str, done: impl Fn(&Committed) -> bool) {
    let deadline = Instant::now() + limit;
    while !done(committed) {
        assert!(
            Instant::now() < deadline,
            "{what}: not reached in {limit:?}; committed {} records",
            committed.values.len()
        );
        committed.poll();
    }
}

/// A line stamped 2100-01-01, far past any processing clock.
const YEAR_2100: i64 = 4_102_444_800_000;

#[test]
fn members_killed_started_and_stopped_mid_run_commit_each_count_exactly_once() {
    let (input, output, app) = (unique("app-in"), unique("app-out"), unique("app"));
    let (top_topic, late_topic) = (format!("{output}-top"), format!("{output}-late"));
    // The broker refuses a record stamped over an hour ahead unless the
    // topic allows it; a producer stamping events itself may have it so.
    create_topics_with(&[(&input, PARTITIONS)], &[("message.timestamp.after.max.ms", "9223372036854775807")]);
    create_topics(&[(&output, 1), (&top_topic, 1), (&late_topic, 1)]);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = (now - 300_000) / WINDOW_MS * WINDOW_MS;
    let mut lines = lines(base);
    // In the middle of partition 2: a line stamped year 2100. It must not
    // move the watermark (which would make every later word late for good).
    let future = (2, YEAR_2100, "from the future".to_string());
    lines.insert(lines.len() / 2, future.clone());
    produce(&input, &lines);
    // Every window the watermark closes: each partition's last record is
    // within the last window, less the 2 s bound.
    let counted: Vec<(i32, i64, String)> = lines.iter().filter(|l| l.1 != YEAR_2100).cloned().collect();
    let expected = reference(&counted, base + 80_000);
    let dir = tempfile::tempdir().unwrap();
    let mut counts = Committed::new(&output);

    let m1 = member(&app, &input, &output, dir.path(), "m1");
    let mut m2 = member(&app, &input, &output, dir.path(), "m2");
    let m3 = member(&app, &input, &output, dir.path(), "m3");
    wait_until(&mut counts, Duration::from_secs(90), "first counts", |c| !c.values.is_empty());
    m2.kill();
    let m4 = member(&app, &input, &output, dir.path(), "m4");
    let seen = counts.values.len();
    wait_until(&mut counts, Duration::from_secs(90), "counts after the kill", |c| c.values.len() > seen + 5);
    m1.stop_gracefully();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        counts.poll();
        let got = counts.counts();
        let wrong: Vec<_> = expected.iter().filter(|(k, v)| got.get(*k) != Some(*v)).collect();
        if wrong.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let mut late = Committed::new(&late_topic);
            late.poll();
            let shown: Vec<String> =
                wrong.iter().take(8).map(|(k, v)| format!("{k:?}: expected {v}, got {:?}", got.get(*k))).collect();
            panic!(
                "every count: not reached in 180 s; {} of {} windows wrong: {}; late words: {}",
                wrong.len(),
                expected.len(),
                shown.join("; "),
                late.values.len()
            );
        }
    }
    // Nothing written twice, and nothing written again: no word came late
    // with the default lateness, though members were killed and the split
    // tasks ran their backlogs each in its own order.
    let mut once = BTreeSet::new();
    for v in &counts.values {
        let key = (v["word"].to_string(), v["windowStart"].as_i64(), v["revision"].as_u64());
        assert!(once.insert(key.clone()), "written twice: {key:?}");
        assert_eq!(v["revision"].as_u64(), Some(0), "a window was counted again after late words: {v}");
    }
    // The late words are exactly those of the line from the future.
    let mut late = Committed::new(&late_topic);
    wait_until(&mut late, Duration::from_secs(60), "the future line's words", |l| l.values.len() >= 3);
    let mut late_words: Vec<(String, i64)> = late
        .values
        .iter()
        .map(|v| (v["word"].as_str().unwrap().to_string(), v["timestamp"].as_i64().unwrap()))
        .collect();
    late_words.sort();
    let from_the_future = [("from", YEAR_2100), ("future", YEAR_2100), ("the", YEAR_2100)];
    assert_eq!(late_words, from_the_future.map(|(w, ts)| (w.to_string(), ts)));
    // The one-owner stage: each compared window's last top words are the reference's.
    let mut tops = Committed::new(&top_topic);
    let windows: BTreeSet<i64> = expected.keys().map(|(_, start)| *start).collect();
    let top_of = |start: i64| {
        let mut words: Vec<(String, u64)> =
            expected.iter().filter(|((_, s), _)| *s == start).map(|((w, _), n)| (w.clone(), *n)).collect();
        words.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        words.truncate(3);
        serde_json::to_value(&words).unwrap()
    };
    wait_until(&mut tops, Duration::from_secs(60), "every window's top words", |t| {
        windows.iter().all(|start| {
            t.values.iter().rev().find(|v| v["windowStart"].as_i64() == Some(*start)).map(|v| &v["top"])
                == Some(&top_of(*start))
        })
    });
    m3.stop_gracefully();
    m4.stop_gracefully();
}

/// The client ids (member ids) of the members of `group` the broker knows now.
fn group_members(group: &str) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let list = consumer.fetch_group_list(Some(group), Duration::from_secs(10)).unwrap();
    let found = list.groups().iter().find(|g| g.name() == group && g.state() == "Stable");
    found.map(|g| g.members().iter().map(|m| m.client_id().to_string()).collect()).unwrap_or_default()
}

/// The `writerEpoch` of a checkpoint log entry's text.
fn writer_epoch(entry: &str) -> Option<u64> {
    let line: Value = serde_json::from_str(entry.lines().nth(1)?).ok()?;
    line["writerEpoch"].as_u64()
}

#[test]
fn a_member_paused_past_its_session_timeout_commits_nothing_when_it_resumes() {
    let (input, output, app) = (unique("zombie-in"), unique("zombie-out"), unique("zombie"));
    create_topics(&[(&input, 2), (&output, 1), (&format!("{output}-top"), 1), (&format!("{output}-late"), 1)]);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = (now - 300_000) / WINDOW_MS * WINDOW_MS;
    let lines: Vec<(i32, i64, String)> = lines(base).into_iter().map(|(p, ts, l)| (p % 2, ts, l)).collect();
    produce(&input, &lines);
    let dir = tempfile::tempdir().unwrap();
    let held = tempfile::tempdir().unwrap();

    // m1 alone owns every task; each holds batch 3 before its outputs.
    let m1 = {
        let mut command = Command::new(env!("CARGO_BIN_EXE_spate"));
        let brokers = brokers();
        command.args([
            "run",
            "--app",
            &app,
            "--member-id",
            "m1",
            "--kafka",
            &brokers,
            "--topic",
            &input,
            "--output-topic",
            &output,
            "--checkpoint",
            dir.path().to_str().unwrap(),
            "--batch-ms",
            "200",
            "--session-timeout-ms",
            "6000",
            "--heartbeat-interval-ms",
            "1000",
            "--max-rate-per-partition",
            "150",
            "--window-ms",
            "10000",
            "--slide-ms",
            "10000",
            "--allowed-lateness-ms",
            "600000",
            "--transaction-timeout-ms",
            "5000",
        ]);
        command.env("SPATE_FAILPOINTS", "hold-before-outputs").env("SPATE_FAILPOINT_DIR", held.path());
        command.env("SPATE_FAILPOINT_BATCH", "3");
        Running::spawn(command, "m1")
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    while !held.path().join("held").exists() {
        assert!(Instant::now() < deadline, "m1 never held a batch");
        std::thread::sleep(Duration::from_millis(20));
    }
    m1.signal("-STOP");
    // m2 joins; the group drops m1 once its session runs out.
    let m2 = member(&app, &input, &output, dir.path(), "m2");
    let deadline = Instant::now() + Duration::from_secs(90);
    while group_members(&app) != ["m2"] {
        assert!(Instant::now() < deadline, "the group did not drop the paused member");
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::write(held.path().join("release"), b"").unwrap();
    m1.signal("-CONT");

    // Every count arrives once, and no batch at or after the held one was
    // committed by m1's epoch (1) in any task's checkpoint.
    let mut counts = Committed::new(&output);
    let expected = reference(&lines, base + 60_000);
    wait_until(&mut counts, Duration::from_secs(180), "every count", |c| {
        let got = c.counts();
        expected.iter().all(|(k, v)| got.get(k) == Some(v))
    });
    let mut once = BTreeSet::new();
    for v in &counts.values {
        let key = (v["word"].to_string(), v["windowStart"].as_i64(), v["revision"].as_u64());
        assert!(once.insert(key.clone()), "written twice: {key:?}");
    }
    let mut checked = 0;
    for task in std::fs::read_dir(dir.path().join("tasks")).unwrap() {
        let commits = task.unwrap().path().join("commits");
        for entry in std::fs::read_dir(&commits).unwrap() {
            let path = entry.unwrap().path();
            // A name that is no batch id is a write under way (its
            // temporary file); old entries are purged while the members run.
            let Ok(batch) = path.file_name().unwrap().to_str().unwrap().parse::<u64>() else { continue };
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let epoch = writer_epoch(&text).unwrap_or_else(|| panic!("{} names no writer epoch", path.display()));
            if batch >= 3 {
                assert!(epoch >= 2, "{} was committed by the paused member (epoch {epoch})", path.display());
                checked += 1;
            }
        }
    }
    assert!(checked > 0, "no task committed past the held batch");
    m1.stop_gracefully();
    m2.stop_gracefully();
}
