//! Watching a running `spate demo`: `/metrics` scraped twice during the run
//! and parsed as the Prometheus text format, and the web page loaded in
//! headless Chromium (Debian's `chromium`, installed by `cargo xtask
//! setup`), whose table and charts must fill and change from batch to
//! batch. Every wait polls the job with a give-up deadline; none orders
//! events by sleeping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use serde_json::Value;

const SPATE: &str = env!("CARGO_BIN_EXE_spate");

/// How long a test waits for the job before it gives up and fails
/// (generous: a loaded machine is slow, never wrong).
const GIVE_UP: Duration = Duration::from_secs(180);

/// Between two polls of something the job will do.
const POLL: Duration = Duration::from_millis(50);

/// A running demo with its stderr lines; stopped (SIGINT, then killed) when dropped.
struct Demo {
    child: Child,
    stderr: Receiver<String>,
    _checkpoint: tempfile::TempDir,
}

impl Demo {
    /// Starts `spate demo` with `watch` flags (100 ms batches, a small rate).
    fn start(watch: &[&str]) -> Demo {
        let checkpoint = tempfile::tempdir().unwrap();
        let dir = checkpoint.path().join("ck");
        let mut args = vec![
            "demo",
            "--checkpoint",
            dir.to_str().unwrap(),
            "--batch-ms",
            "100",
            "--rate",
            "20000",
            "--seconds",
            "900",
            "--quiet",
        ];
        args.extend_from_slice(watch);
        let mut child = Command::new(SPATE)
            .args(&args)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, stderr) = std::sync::mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Demo { child, stderr, _checkpoint: checkpoint }
    }

    /// The address in the stderr line starting with `prefix` (`metrics: http://`).
    fn url_address(&self, prefix: &str) -> SocketAddr {
        let deadline = Instant::now() + GIVE_UP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.stderr.recv_timeout(left).unwrap_or_else(|e| panic!("no stderr line {prefix:?}: {e}"));
            if let Some(rest) = line.strip_prefix(prefix) {
                let authority = rest.split('/').next().unwrap();
                return authority.parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
            }
        }
    }

    /// Stops it as Ctrl-C does and checks it ended well.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-INT", &pid]).status().unwrap().success());
        let status = self.child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "the demo did not stop gracefully");
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A `GET` with a plain socket; the status code and the body.
fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {answer:?}"));
    assert!(head.contains("Connection: close"), "{head}");
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, body.to_string())
}

/// One sample of the text format: its name, labels and value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text format strictly: every line is a sample
/// (`name{labels} value` or `name value`), a `# HELP`/`# TYPE` line, or empty.
fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split(' ').next().unwrap();
            assert!(kind == "HELP" || kind == "TYPE", "unexpected comment line {line:?}");
            if kind == "TYPE" {
                let ty = comment.rsplit(' ').next().unwrap();
                assert!(["counter", "gauge", "histogram", "summary"].contains(&ty), "{line:?}");
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').unwrap_or_else(|| panic!("{line:?}")))),
            None => (series, BTreeMap::new()),
        };
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        samples.push(Sample { name: name.to_string(), labels, value });
    }
    samples
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("bad labels {text:?}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().unwrap_or_else(|| panic!("unterminated label in {text:?}")) {
                (i, '"') => break i,
                (_, '\\') => value.push(chars.next().unwrap().1),
                (_, c) => value.push(c),
            }
        };
        let name = name.strip_prefix(',').unwrap_or(name);
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "bad label name {name:?}");
        labels.insert(name.to_string(), value);
        rest = &after[end + 1..];
    }
    labels
}

fn value_of(samples: &[Sample], name: &str) -> Option<f64> {
    samples.iter().find(|s| s.name == name && s.labels.is_empty()).map(|s| s.value)
}

fn with_label<'a>(samples: &'a [Sample], name: &str, label: &str, value: &str) -> Option<&'a Sample> {
    samples.iter().find(|s| s.name == name && s.labels.get(label).map(String::as_str) == Some(value))
}

/// Scrapes until `ready` holds for the samples; returns them.
fn scrape_until(addr: SocketAddr, what: &str, ready: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let deadline = Instant::now() + GIVE_UP;
    loop {
        let (code, body) = http_get(addr, "/metrics");
        assert_eq!(code, 200, "{body}");
        let samples = parse_metrics(&body);
        if ready(&samples) {
            return samples;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}; last scrape:\n{body}");
        std::thread::sleep(POLL);
    }
}

#[test]
fn metrics_are_scraped_twice_during_a_demo_run_and_move_with_the_batches() {
    let demo = Demo::start(&["--metrics-addr", "127.0.0.1:0", "--ui", "127.0.0.1:0"]);
    let addr = demo.url_address("metrics: http://");
    // The same address for both: one server serves /metrics and the page.
    assert_eq!(demo.url_address("web page: http://"), addr);
    let first = scrape_until(addr, "a committed batch", |s| value_of(s, "spate_batches_committed_total").is_some());
    let committed = value_of(&first, "spate_batches_committed_total").unwrap();
    assert!(committed >= 1.0);
    // The first batches can be empty while the receiver starts: wait for
    // more batches and for records to have gone through one of them.
    let second = scrape_until(addr, "more committed batches with input", |s| {
        value_of(s, "spate_batches_committed_total").is_some_and(|n| n > committed)
            && with_label(s, "spate_input_records_total", "partition", "0").is_some_and(|i| i.value > 0.0)
    });
    // The figures an operator alerts on are there, with their labels.
    for name in ["spate_wal_appends_total", "spate_wal_syncs_total", "spate_wal_bytes_total"] {
        let wal = with_label(&second, name, "log", "receivedData/0").unwrap_or_else(|| panic!("no {name}"));
        assert!(wal.value > 0.0, "{wal:?}");
        assert!(with_label(&second, name, "log", "receivedBlockMetadata").is_some(), "no {name} of the tracker's log");
    }
    assert!(
        with_label(&second, "spate_wal_sync_seconds_count", "log", "receivedData/0").is_some_and(|s| s.value > 0.0)
    );
    assert!(with_label(&second, "spate_wal_sync_seconds_bucket", "le", "+Inf").is_some());
    for name in ["spate_input_records_total", "spate_input_bytes_total"] {
        let input = with_label(&second, name, "partition", "0").unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(input.labels.get("source").map(String::as_str), Some("words"), "{input:?}");
        assert!(input.value > 0.0, "{input:?}");
    }
    assert!(with_label(&second, "spate_blocks_in_memory", "stream", "0").is_some());
    assert!(with_label(&second, "spate_block_bytes_in_memory", "stream", "0").is_some());
    assert!(value_of(&second, "spate_batch_processing_seconds_count").is_some_and(|n| n > committed));
    assert!(value_of(&second, "spate_batch_scheduling_delay_seconds_count").is_some_and(|n| n > committed));
    assert!(value_of(&second, "spate_last_committed_batch").is_some());
    assert_eq!(with_label(&second, "spate_recovery_verdict", "verdict", "fresh").map(|s| s.value), Some(1.0));
    assert_eq!(with_label(&second, "spate_recovery_verdict", "verdict", "resume").map(|s| s.value), Some(0.0));
    assert_eq!(value_of(&second, "spate_checkpoint_epoch"), Some(1.0));
    // The page and its status are on the same server; other paths are not.
    assert_eq!(http_get(addr, "/").0, 200);
    assert_eq!(http_get(addr, "/api/status").0, 200);
    assert_eq!(http_get(addr, "/nothing-here").0, 404);
    demo.stop();
}

/// The newest committed batch in `/api/status`, if any, and how many are committed.
fn committed_batches(addr: SocketAddr) -> (Option<u64>, usize) {
    let (code, body) = http_get(addr, "/api/status");
    assert_eq!(code, 200, "{body}");
    let status: Value = serde_json::from_str(&body).unwrap();
    let committed: Vec<u64> = status["batches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["committed"] == Value::Bool(true))
        .map(|b| b["batch_id"].as_u64().unwrap())
        .collect();
    (committed.iter().max().copied(), committed.len())
}

/// Polls `/api/status` until at least `count` batches committed and the
/// newest is at least `at_least`; returns the newest.
fn await_committed(addr: SocketAddr, count: usize, at_least: u64) -> u64 {
    let deadline = Instant::now() + GIVE_UP;
    loop {
        if let (Some(newest), n) = committed_batches(addr)
            && n >= count
            && newest >= at_least
        {
            return newest;
        }
        assert!(Instant::now() < deadline, "gave up waiting for batch {at_least} to commit");
        std::thread::sleep(POLL);
    }
}

/// The page's DOM after headless Chromium ran its script.
fn dump_dom(url: &str) -> String {
    let output = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000", "--dump-dom", url])
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run chromium ({e}): this test loads the page in a real browser; install it with \
                 `cargo xtask setup` (or `apt-get install chromium`)"
            )
        });
    assert!(output.status.success(), "chromium failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// The element starting at the tag of `id` up to its closing `</tag>`.
fn element<'a>(dom: &'a str, tag: &str, id: &str) -> &'a str {
    let start = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let open = dom[..start].rfind(&format!("<{tag}")).unwrap();
    let close = dom[open..].find(&format!("</{tag}>")).unwrap();
    &dom[open..open + close]
}

/// The cells of each row of a table's body.
fn rows(table: &str) -> Vec<Vec<String>> {
    let body = table.split_once("<tbody>").unwrap_or_else(|| panic!("no tbody in {table}")).1;
    body.split("<tr")
        .skip(1)
        .map(|row| {
            row.split("<td")
                .skip(1)
                .map(|cell| {
                    let text = cell.split_once('>').unwrap().1;
                    text.split_once("</td>").unwrap().0.to_string()
                })
                .collect()
        })
        .collect()
}

/// The points of a chart's polyline.
fn points(dom: &str, id: &str) -> Vec<(f64, f64)> {
    let tag = element(dom, "polyline", id);
    let value = tag.split_once("points=\"").unwrap_or_else(|| panic!("no points in {tag}")).1;
    let value = value.split_once('"').unwrap().0;
    value
        .split_whitespace()
        .map(|point| {
            let (x, y) = point.split_once(',').unwrap_or_else(|| panic!("bad point {point:?}"));
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// What one dump of the page shows: the newest batch and the charts' points.
fn check_page(dom: &str) -> u64 {
    let batches = rows(element(dom, "table", "batches"));
    assert!(!batches.is_empty() && batches[0].len() == 8, "the batch table did not fill: {batches:?}");
    let committed: Vec<&Vec<String>> = batches.iter().filter(|row| row[7].starts_with("committed")).collect();
    assert!(committed.len() >= 2, "fewer than two committed batches in the table: {batches:?}");
    for id in ["rate-line", "processing-line"] {
        let drawn = points(dom, id);
        assert!(drawn.len() >= 2, "the chart {id} did not draw: {drawn:?}");
        assert!(drawn.iter().all(|(x, y)| x.is_finite() && y.is_finite()), "{id}: {drawn:?}");
    }
    let receivers = rows(element(dom, "table", "receivers"));
    assert_eq!(receivers.first().map(|r| r[0].as_str()), Some("words"), "{receivers:?}");
    assert!(element(dom, "dd", "checkpoint").contains("ck"), "no checkpoint location shown");
    assert!(element(dom, "dd", "recovery").contains("fresh checkpoint"), "no recovery shown");
    batches[0][0].parse().unwrap_or_else(|e| panic!("newest batch id {:?}: {e}", batches[0][0]))
}

#[test]
fn the_page_in_headless_chromium_fills_its_table_and_charts_and_changes_from_batch_to_batch() {
    let version = Command::new("chromium").arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "chromium is missing: this test loads the page in a real browser; install it with `cargo xtask setup` \
         (or `apt-get install chromium`): {version:?}"
    );
    let demo = Demo::start(&["--ui", "127.0.0.1:0"]);
    let addr = demo.url_address("web page: http://");
    let url = format!("http://{addr}/");
    let before = await_committed(addr, 2, 1);
    let first_dom = dump_dom(&url);
    let first = check_page(&first_dom);
    assert!(first >= before, "the page shows batch {first}, the job had committed {before}");
    // A few batches later the page shows other figures.
    await_committed(addr, 2, first + 3);
    let second_dom = dump_dom(&url);
    let second = check_page(&second_dom);
    assert!(second > first, "the newest batch did not change: {first} then {second}");
    assert_ne!(points(&first_dom, "processing-line"), points(&second_dom, "processing-line"));
    demo.stop();
}
