//! Watching a context from a program: `with_metrics_addr` and
//! `with_ui_addr` on port 0 serve `/metrics`, the page and `/api/status`
//! from one server, with the figures of the batches that committed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use serde_json::{Value, json};
use spate_core::{BatchId, Duration, ManualClock, Time};
use spate_dstream::{BatchLimits, BoxError, InputSource};
use spate_runtime::{StreamingContext, StreamingSettings};

const WAIT: StdDuration = StdDuration::from_secs(30);

/// A replayable source with offsets in Kafka's shape: topic `t`, partition 0, ten records a batch.
#[derive(Debug, Default)]
struct TenABatch {
    position: Mutex<u64>,
}

impl InputSource<u64> for TenABatch {
    fn is_replayable(&self) -> bool {
        true
    }

    fn plan(&self, _time: Time, _limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let mut position = self.position.lock().unwrap();
        let planned = json!({"t": {"0": {"from": *position, "until": *position + 10}}}).to_string();
        *position += 10;
        Ok(Some(planned))
    }

    fn compute(&self, _time: Time, planned: Option<&str>) -> Result<Vec<Vec<u64>>, BoxError> {
        let range: Value = serde_json::from_str(planned.ok_or("no plan")?)?;
        let (from, until) = (range["t"]["0"]["from"].as_u64().unwrap(), range["t"]["0"]["until"].as_u64().unwrap());
        Ok(vec![(from..until).collect()])
    }
}

fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

#[test]
fn a_context_serves_metrics_the_page_and_its_status_on_one_address() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(1_000_000));
    let any_port: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let settings = StreamingSettings::new(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()))
        .with_metrics_addr(any_port)
        .with_ui_addr(any_port);
    let source = Arc::new(TenABatch::default());
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings, move |p| {
        p.input("numbers", source).foreach_batch(|_, _| Ok(())).name("sink");
        Ok(())
    })
    .unwrap();
    assert_eq!(ctx.metrics_addr(), None, "nothing is served before start");
    ctx.start().unwrap();
    let addr = ctx.metrics_addr().unwrap();
    assert_ne!(addr.port(), 0);
    assert_eq!(ctx.ui_addr(), Some(addr));
    for batch in 0..3 {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), WAIT));
    }
    let (status_line, body) = get(addr, "/api/status");
    assert_eq!(status_line, "HTTP/1.1 200 OK");
    let status: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["batch_interval_ms"], 1000);
    let committed: Vec<&Value> =
        status["batches"].as_array().unwrap().iter().filter(|b| b["committed"] == true).collect();
    assert_eq!(committed.iter().map(|b| b["batch_id"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(committed[2]["records"], 10);
    assert_eq!(status["partitions"][0]["topic"], "t");
    assert_eq!(status["partitions"][0]["partition"], "0");
    assert_eq!(status["partitions"][0]["rate"], 10.0);
    assert_eq!(status["checkpoint"]["epoch"], 1);
    assert_eq!(status["checkpoint"]["lock_holder"]["pid"], std::process::id());
    assert_eq!(status["recovery"]["resumed_at"], 0);
    let (_, metrics) = get(addr, "/metrics");
    let line = |name: &str| metrics.lines().find(|l| l.starts_with(name)).map(str::to_string);
    assert_eq!(line("spate_batches_committed_total ").as_deref(), Some("spate_batches_committed_total 3"));
    assert_eq!(line("spate_last_committed_batch ").as_deref(), Some("spate_last_committed_batch 2"));
    assert_eq!(line("spate_checkpoint_epoch ").as_deref(), Some("spate_checkpoint_epoch 1"));
    assert!(line("spate_batch_processing_seconds_count").is_some_and(|l| l.ends_with(" 3")), "{metrics}");
    assert!(metrics.contains("spate_recovery_verdict{verdict=\"fresh\"} 1"), "{metrics}");
    let (page_status, page) = get(addr, "/");
    assert_eq!(page_status, "HTTP/1.1 200 OK");
    assert!(page.contains("<svg") && page.contains("/api/status"));
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination().unwrap();
    assert!(TcpStream::connect(addr).is_err(), "still served after the context ended");
}
