//! `spate run` against a real broker: words produced to a topic, the top
//! words of each window read back from the output topic with
//! `read_committed`. Needs a broker: `cargo xtask test` starts one, or
//! `cargo xtask kafka start` then `SPATE_KAFKA_BROKERS=127.0.0.1:<port> cargo test -p spate-cli --test kafka`.
//! Without one the test fails, never passes vacuously.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde_json::Value;

/// The broker the test uses. Fails (never skips) when none is configured.
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
    // The last offsets are transaction markers, never returned: stop once the
    // records before them are read and the partition stays quiet.
    let (mut out, mut position, mut quiet_polls) = (Vec::new(), 0, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline && !(position >= end - 1 && quiet_polls >= 5) && quiet_polls < 50 {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                position = m.offset() + 1;
                quiet_polls = 0;
                out.push(serde_json::from_slice(m.payload().unwrap_or_default()).unwrap());
            }
            _ => quiet_polls += 1,
        }
    }
    out
}

#[test]
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
    let args = |until: &str| -> Vec<String> {
        let mut args = vec!["run", "--kafka", &brokers, "--topic", &input, "--output-topic", &output];
        args.extend(["--exactly-once", "--batch-ms", "200", "--quiet", "--until-batch", until]);
        args.extend(["--checkpoint", checkpoint.to_str().unwrap()]);
        args.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let started = Instant::now();
    let first = Command::new(env!("CARGO_BIN_EXE_spate")).args(args("5")).output().unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", String::from_utf8_lossy(&first.stderr));
    println!("first run: {:?}", started.elapsed());
    // SIGKILL at a few moments, then a run that finishes: no window is written twice.
    for delay_ms in [700, 1500, 2300] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spate")).args(args("1000000")).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let state: Value = serde_json::from_slice(
        &Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["checkpoint", "inspect", "--json", checkpoint.to_str().unwrap()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let until = (state["commits"]["last"].as_u64().unwrap_or(0) + 4).to_string();
    let started = Instant::now();
    let last = Command::new(env!("CARGO_BIN_EXE_spate")).args(args(&until)).output().unwrap();
    assert_eq!(last.status.code(), Some(0), "{}", String::from_utf8_lossy(&last.stderr));
    assert!(String::from_utf8_lossy(&last.stdout).contains("resumed from checkpoint"));
    println!("last run: {:?}", started.elapsed());

    let records = read_committed(&output);
    let batches: Vec<u64> = records.iter().map(|r| r["batch"].as_u64().unwrap()).collect();
    assert!(batches.windows(2).all(|w| w[0] < w[1]), "a window was written twice or out of order: {batches:?}");
    assert!(batches.len() >= 4, "{records:?}");
    // All input was there before the first batch, so batch 0 read it all: every window
    // that still holds batch 0 counts every word exactly once, and later windows are empty.
    let windows: Vec<BTreeMap<String, u64>> = records
        .iter()
        .map(|r| {
            r["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_u64().unwrap()))
                .collect()
        })
        .collect();
    let full: Vec<&BTreeMap<String, u64>> = windows.iter().filter(|w| !w.is_empty()).collect();
    assert!(!full.is_empty(), "{records:?}");
    assert!(full.iter().all(|w| **w == expected), "{records:?}");
}

/// A `GET` with a plain socket; the body of a 200 answer.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    body.to_string()
}

#[test]
fn run_serves_the_partitions_lag_and_transactions_while_it_reads_a_backlog() {
    use std::io::BufRead;
    let (input, output) = (unique("spate-cli-watch-in"), unique("spate-cli-watch-out"));
    let lines: Vec<String> = (0..400).map(|i| format!("word{} other", i % 7)).collect();
    produce(&input, &lines);
    let root = tempfile::tempdir().unwrap();
    let checkpoint = root.path().join("ck");
    let brokers = brokers();
    // 10 records a batch: the backlog lags for many batches.
    let args = [
        "run",
        "--kafka",
        &brokers,
        "--topic",
        &input,
        "--output-topic",
        &output,
        "--exactly-once",
        "--quiet",
        "--batch-ms",
        "200",
        "--max-rate-per-partition",
        "50",
        "--seconds",
        "900",
        "--checkpoint",
        checkpoint.to_str().unwrap(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--ui",
        "127.0.0.1:0",
    ];
    let mut child = Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let addr = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "spate run ended without printing its metrics URL");
        if let Some(rest) = line.trim().strip_prefix("metrics: http://") {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    let lag_line = format!("spate_kafka_consumer_lag{{topic=\"{input}\",partition=\"0\"}} ");
    let committed_line = format!("spate_kafka_transactions_committed_total{{topic=\"{output}\"}} ");
    let deadline = Instant::now() + Duration::from_secs(180);
    let metrics = loop {
        let text = http_get(&addr, "/metrics");
        let value = |prefix: &str| -> Option<f64> {
            text.lines().find_map(|l| l.strip_prefix(prefix)).map(|v| v.trim().parse().unwrap())
        };
        if value(&lag_line).is_some_and(|lag| lag > 0.0) && value(&committed_line).is_some_and(|n| n >= 1.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "no lag or transaction in /metrics:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let records = format!("spate_input_records_total{{source=\"{input}\",partition=\"0\"}} ");
    assert!(metrics.lines().any(|l| l.starts_with(&records)), "{metrics}");
    let status: Value = serde_json::from_str(&http_get(&addr, "/api/status")).unwrap();
    let partition = &status["partitions"][0];
    assert_eq!(partition["topic"], Value::String(input.clone()), "{status}");
    assert_eq!(partition["partition"], "0");
    assert!(partition["lag"].as_f64().is_some(), "no lag on the page's data: {status}");
    assert!(status["receivers"].as_array().unwrap().is_empty());
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
