//! Members of one application against the local broker: a word count
//! whose words are repartitioned by key, counted per event-time window,
//! gives exactly the counts of the input while members leave and join, and
//! while one split task is held back and the others run their whole
//! backlog ahead (with the default lateness: nothing is late).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration as StdDuration, Instant, SystemTime, UNIX_EPOCH};

use common::{brokers, unique};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use spate_app::{Emit, Member, MemberEvent, MemberListener, MemberSettings, Topology};
use spate_core::{Duration, Time};
use spate_dstream::{EventWindows, Watermarks};
use spate_kafka::{GroupSettings, KafkaRecord};
use spate_logstore::ObjectStoreSettings;
use spate_runtime::StreamingSettings;

const WINDOW_MS: i64 = 10_000;

/// The lines: `(partition, timestamp, text)`, `count` lines 50 ms apart
/// from `base`, round-robin over the 4 partitions.
fn lines(base: i64, count: i64) -> Vec<(i32, i64, String)> {
    let words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda"];
    (0..count)
        .map(|i| {
            let text: Vec<&str> = (0..3).map(|j| words[((i * 7 + j * 3 + i / 5) % 11) as usize]).collect();
            ((i % 4) as i32, base + i * 50, text.join(" "))
        })
        .collect()
}

/// Holds a task until released.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn release(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

fn produce(topic: &str, lines: &[(i32, i64, String)]) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("enable.idempotence", "true").create().unwrap();
    for (partition, ts, text) in lines {
        let record = BaseRecord::<(), String>::to(topic).payload(text).partition(*partition).timestamp(*ts);
        producer.send(record).map_err(|(e, _)| e).unwrap();
        producer.poll(StdDuration::ZERO);
    }
    producer.flush(StdDuration::from_secs(30)).unwrap();
}

/// The count of each (word, window start) over windows that end by `until`.
fn reference(lines: &[(i32, i64, String)], until: i64) -> BTreeMap<(String, i64), u64> {
    let mut counts = BTreeMap::new();
    for (_, ts, text) in lines {
        for word in text.split_whitespace() {
            let start = ts.div_euclid(WINDOW_MS) * WINDOW_MS;
            if start + WINDOW_MS <= until {
                *counts.entry((word.to_string(), start)).or_default() += 1;
            }
        }
    }
    counts
}

/// The default of `spate run --app`.
const ALLOWED_LATENESS: Duration = Duration::from_secs(60);

fn topology(app: &str, input: &str, output: &str, late: &str, held: Option<Arc<Gate>>) -> Topology {
    let (output, late) = (output.to_string(), late.to_string());
    Topology::new(app)
        .stage_from_topic("split", input, move |task| {
            // The split task of partition 0 waits at the gate, if any.
            let gate = held.clone().filter(|_| task.task().partition == 0);
            let words = task.records().flat_map(move |r: KafkaRecord| {
                if let Some(gate) = &gate {
                    gate.wait();
                }
                let ts = r.timestamp.unwrap_or_default();
                let text = String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned();
                text.split_whitespace().map(|w| (w.to_string(), (ts, 1u64))).collect::<Vec<_>>()
            });
            task.repartition_by_key("words", &words, |(ts, _)| Some(Time::from_millis(*ts)))
        })
        .stage_from_repartition("count", "words", move |task| {
            let (output, late) = (output.clone(), late.clone());
            let counted = task
                .repartitioned::<String, (i64, u64)>()
                .records()
                .aggregate_by_event_time(
                    |(ts, _): &(i64, u64)| Time::from_millis(*ts),
                    Watermarks::bounded_out_of_orderness(Duration::from_secs(2)),
                    EventWindows::tumbling(Duration::from_millis(WINDOW_MS as u64)).allowed_lateness(ALLOWED_LATENESS),
                    |(_, n)| n,
                    |acc: &mut u64, (_, n)| *acc += n,
                    |acc: &mut u64, other: &u64| *acc += other,
                )
                .name("counts");
            let late = counted.late().map(move |(word, (ts, _))| {
                Emit::to_topic(&late, Some(word.into_bytes()), ts.to_string().into_bytes())
            });
            Ok(counted
                .results()
                .map(move |r| {
                    let key = format!("{}@{}", r.key, r.window.start.as_millis());
                    Emit::to_topic(&output, Some(key.into_bytes()), format!("{},{}", r.value, r.revision).into_bytes())
                })
                .union(&late))
        })
}

fn settings(location: &Path, object_store: &ObjectStoreSettings, member: &str) -> MemberSettings {
    let mut s = MemberSettings::new(&brokers(), location, StreamingSettings::new(Duration::from_millis(200)), member);
    s.object_store = object_store.clone();
    s.group = GroupSettings {
        session_timeout: StdDuration::from_secs(6),
        heartbeat_interval: StdDuration::from_secs(1),
        ..GroupSettings::default()
    };
    s.max_rate_per_partition = Some(500);
    s
}

/// Every committed record of `topic`: `(key, value)`, in offset order per partition.
struct Committed {
    consumer: BaseConsumer,
    seen: Vec<(String, String)>,
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
        Committed { consumer, seen: Vec::new() }
    }

    fn poll(&mut self) {
        while let Some(message) = self.consumer.poll(StdDuration::from_millis(200)) {
            let m = message.unwrap();
            let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
            let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            self.seen.push((key, value));
        }
    }

    /// The last revision of each window's count.
    fn latest(&self) -> BTreeMap<(String, i64), u64> {
        let mut best: BTreeMap<(String, i64), (u32, u64)> = BTreeMap::new();
        for (key, value) in &self.seen {
            let (word, start) = key.rsplit_once('@').unwrap();
            let (count, revision) = value.split_once(',').unwrap();
            let (count, revision): (u64, u32) = (count.parse().unwrap(), revision.parse().unwrap());
            let entry = best.entry((word.to_string(), start.parse().unwrap())).or_insert((revision, count));
            if revision >= entry.0 {
                *entry = (revision, count);
            }
        }
        best.into_iter().map(|(k, (_, count))| (k, count)).collect()
    }

    /// Every window written once, as revision 0: nothing came late.
    fn assert_no_revisions(&self) {
        for (key, value) in &self.seen {
            assert!(value.ends_with(",0"), "{key} was written again ({value}): a word came late");
        }
    }

    /// Each (window, revision) written once: no batch committed twice.
    fn assert_no_repeats(&self) {
        let mut once = BTreeSet::new();
        for (key, value) in &self.seen {
            let revision = value.split_once(',').unwrap().1;
            assert!(once.insert((key.clone(), revision.to_string())), "{key} revision {revision} written twice");
        }
    }

    /// Polls until the counts of `expected`'s windows equal it (failing after two minutes).
    fn wait_for(&mut self, expected: &BTreeMap<(String, i64), u64>) {
        let deadline = Instant::now() + StdDuration::from_secs(120);
        loop {
            self.poll();
            let latest = self.latest();
            let got: BTreeMap<_, _> =
                latest.iter().filter(|(k, _)| expected.contains_key(k)).map(|(k, v)| (k.clone(), *v)).collect();
            if &got == expected {
                return;
            }
            assert!(Instant::now() < deadline, "counts after two minutes: {got:?}\nexpected {expected:?}");
        }
    }
}

#[test]
fn members_that_leave_and_join_count_every_word_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    leave_and_join(dir.path(), &ObjectStoreSettings::default());
}

#[test]
fn members_on_an_s3_location_hand_their_tasks_over_through_the_leases() {
    let endpoint = std::env::var("SPATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SPATE_TEST_S3_ENDPOINT is not set: this test needs an S3 server. Run it with `cargo xtask test`, \
             or start one with `cargo xtask s3 start` and export what it prints"
        )
    });
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let settings = ObjectStoreSettings {
        endpoint: Some(endpoint),
        region: Some(var("AWS_REGION", "us-east-1")),
        access_key_id: Some(var("AWS_ACCESS_KEY_ID", "spate-test")),
        secret_access_key: Some(var("AWS_SECRET_ACCESS_KEY", "spate-test-secret")),
        allow_http: Some(true),
    };
    let bucket = var("SPATE_TEST_S3_BUCKET", "spate-test");
    let location = PathBuf::from(format!("s3://{bucket}/tests/{}", unique("members")));
    leave_and_join(&location, &settings);
}

/// Two members count; one leaves and a third joins while they run.
fn leave_and_join(location: &Path, object_store: &ObjectStoreSettings) {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info,rdkafka=warn").try_init();
    let (input, output, app) = (unique("lines"), unique("counts"), unique("wordcount"));
    spate_kafka::ensure_topic(&brokers(), &input, 4).unwrap();
    spate_kafka::ensure_topic(&brokers(), &output, 1).unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = (now - 120_000) / WINDOW_MS * WINDOW_MS;
    let lines = lines(base, 1_200);
    produce(&input, &lines);
    let expected = reference(&lines, base + 40_000);
    let mut committed = Committed::new(&output);
    let late = unique("late");
    let start = |member: &str| {
        let topology = topology(&app, &input, &output, &late, None);
        Member::start(topology, settings(location, object_store, member), None).unwrap()
    };
    let (a, b) = (start("a"), start("b"));
    // Wait for the first counts, then let a go and bring c in.
    let deadline = Instant::now() + StdDuration::from_secs(60);
    while committed.seen.is_empty() {
        committed.poll();
        assert!(Instant::now() < deadline, "no count was committed");
    }
    a.leave().unwrap();
    let c = start("c");
    committed.wait_for(&expected);
    committed.assert_no_repeats();
    assert!(!b.tasks().is_empty() || !c.tasks().is_empty());
    b.leave().unwrap();
    c.leave().unwrap();
}

#[test]
fn a_split_task_held_back_while_the_others_run_their_backlog_makes_no_word_late() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info,rdkafka=warn").try_init();
    let (input, output, late, app) = (unique("lines"), unique("counts"), unique("late"), unique("held"));
    spate_kafka::ensure_topic(&brokers(), &input, 4).unwrap();
    spate_kafka::ensure_topic(&brokers(), &output, 1).unwrap();
    spate_kafka::ensure_topic(&brokers(), &late, 1).unwrap();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = (now - 600_000) / WINDOW_MS * WINDOW_MS;
    // 240 s of event time: four times the allowed lateness.
    let lines = lines(base, 4_800);
    produce(&input, &lines);
    let per_partition = lines.iter().filter(|(p, _, _)| *p == 1).count() as u64;
    // Every window that ends before the last record's time, less the bound.
    let expected = reference(&lines, base + 238_000);
    let gate = Arc::new(Gate::default());
    let read: Arc<Mutex<BTreeMap<i32, u64>>> = Arc::default();
    let (seen, release) = (Arc::clone(&read), Arc::clone(&gate));
    // The held task is let go once the other split tasks have read their whole partition.
    let listener: MemberListener = Arc::new(move |event: &MemberEvent| {
        if let MemberEvent::Batch { task, progress } = event
            && task.stage == "split"
            && task.partition != 0
        {
            let mut read = seen.lock().unwrap();
            *read.entry(task.partition).or_default() += progress.input_records;
            if (1..4).all(|p| read.get(&p).copied().unwrap_or_default() >= per_partition) {
                release.release();
            }
        }
    });
    let mut committed = Committed::new(&output);
    let dir = tempfile::tempdir().unwrap();
    let member = Member::start(
        topology(&app, &input, &output, &late, Some(Arc::clone(&gate))),
        settings(dir.path(), &ObjectStoreSettings::default(), "m"),
        Some(listener),
    )
    .unwrap();
    committed.wait_for(&expected);
    committed.assert_no_repeats();
    committed.assert_no_revisions();
    assert!(*gate.open.lock().unwrap(), "the held task was let go");
    member.leave().unwrap();
    // Nothing was ever written to the late topic (not even an aborted transaction's marker).
    let (_, end) = Committed::new(&late).consumer.fetch_watermarks(&late, 0, StdDuration::from_secs(30)).unwrap();
    assert_eq!(end, 0, "words came late");
}
