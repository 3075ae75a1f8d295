//! `spate run` against a real broker: words produced to a topic, the top
//! words of each window read back from the output topic with
//! `read_committed`. Needs a broker: `cargo xtask kafka start`, then
//! `SPATE_KAFKA_BROKERS=127.0.0.1:<port> cargo test -p spate-cli --test kafka -- --ignored`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::Value;

fn brokers() -> String {
    std::env::var("SPATE_KAFKA_BROKERS").expect("set SPATE_KAFKA_BROKERS (e.g. after `cargo xtask kafka start`)")
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn produce(topic: &str, lines: &[String]) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    for line in lines {
        while producer.send(BaseRecord::<(), String>::to(topic).payload(line)).is_err() {
            producer.poll(Duration::from_millis(20));
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Every committed record of partition 0 of `topic`.
fn read_committed(topic: &str) -> Vec<Value> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", unique("reader"))
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (_, end) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10)).unwrap();
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&list).unwrap();
    let (mut out, mut position) = (Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while position < end && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            position = m.offset() + 1;
            out.push(serde_json::from_slice(m.payload().unwrap_or_default()).unwrap());
        }
    }
    out
}

#[test]
#[ignore = "needs a Kafka broker: set SPATE_KAFKA_BROKERS and run with --ignored"]
fn run_counts_a_topic_and_writes_each_window_once_in_a_transaction() {
    let (input, output) = (unique("spate-cli-in"), unique("spate-cli-out"));
    let words = ["stream", "batch", "offset", "commit", "window"];
    let lines: Vec<String> = (0..300).map(|i| format!("{} {}", words[i % 5], words[(i * 7) % 5])).collect();
    produce(&input, &lines);
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for word in lines.iter().flat_map(|l| l.split(' ')) {
        *expected.entry(word.to_string()).or_default() += 1;
    }

    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let brokers = brokers();
    let args = |until: &str| {
        let mut args = vec!["run", "--kafka", &brokers, "--topic", &input, "--output-topic", &output];
        args.extend(["--exactly-once", "--batch-ms", "200", "--quiet", "--until-batch", until]);
        args.extend(["--checkpoint", checkpoint.to_str().unwrap()]);
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let first = Command::new(env!("CARGO_BIN_EXE_spate")).args(args("5")).output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", String::from_utf8_lossy(&first.stderr));
    // A second run resumes from the checkpoint; nothing new arrived, so the windows only repeat the counts.
    let second = Command::new(env!("CARGO_BIN_EXE_spate")).args(args("9")).output().unwrap();
    assert_eq!(second.status.code(), Some(0), "{}", String::from_utf8_lossy(&second.stderr));
    assert!(String::from_utf8_lossy(&second.stdout).contains("resumed from checkpoint"));

    let records = read_committed(&output);
    let batches: Vec<u64> = records.iter().map(|r| r["batch"].as_u64().unwrap()).collect();
    let mut unique_batches = batches.clone();
    unique_batches.dedup();
    assert_eq!(batches, unique_batches, "a window was written twice");
    assert!(batches.len() >= 4, "{records:?}");
    let last: BTreeMap<String, u64> = records.last().unwrap()["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| (pair[0].as_str().unwrap().to_string(), pair[1].as_u64().unwrap()))
        .collect();
    assert_eq!(last, expected, "the last window holds every word once");
}
