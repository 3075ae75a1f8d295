//! A task whose checkpoint another writer holds waits for it without
//! opening a Kafka client for every look at the lock. Alone in its test
//! binary: it counts the log lines of the whole process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration as StdDuration, Instant};

use spate_core::sync::lock;

use common::{brokers, unique};
use spate_app::{Emit, Member, MemberEvent, MemberSettings, Topology};
use spate_core::{Duration, SystemClock};
use spate_kafka::KafkaRecord;
use spate_logstore::WriterLock;
use spate_runtime::StreamingSettings;

/// The log of the process, as text, with a condition variable to wait on.
#[derive(Default)]
struct Log {
    text: Mutex<String>,
    grew: Condvar,
}

struct LogWriter(Arc<Log>);

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        lock(&self.0.text).push_str(&String::from_utf8_lossy(bytes));
        self.0.grew.notify_all();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    fn count(&self, line: &str) -> usize {
        self.text.lock().unwrap().matches(line).count()
    }

    /// Waits (failing after a minute) until `line` was logged `n` times or more.
    fn wait_for(&self, line: &str, n: usize) {
        let deadline = Instant::now() + StdDuration::from_secs(60);
        let mut text = self.text.lock().unwrap();
        while text.matches(line).count() < n {
            let left = deadline.checked_duration_since(Instant::now()).unwrap_or_else(|| panic!("timed out: {line}"));
            text = self.grew.wait_timeout(text, left).unwrap().0;
        }
    }
}

#[test]
fn a_task_waiting_for_its_checkpoint_opens_one_kafka_stream() {
    let log = Arc::new(Log::default());
    let writer = Arc::clone(&log);
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_env_filter("info,spate_app=debug,rdkafka=warn")
        .with_writer(move || LogWriter(Arc::clone(&writer)))
        .init();
    let (input, output, app) = (unique("held-in"), unique("held-out"), unique("held"));
    spate_kafka::ensure_topic(&brokers(), &input, 1).unwrap();
    spate_kafka::ensure_topic(&brokers(), &output, 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Another writer holds the one task's checkpoint.
    let checkpoint = dir.path().join("tasks").join(format!("{input}-0"));
    std::fs::create_dir_all(&checkpoint).unwrap();
    let held = WriterLock::acquire(&checkpoint, &SystemClock).unwrap();

    let started = Arc::new((Mutex::new(false), Condvar::new()));
    let seen = Arc::clone(&started);
    let listener: spate_app::MemberListener = Arc::new(move |event: &MemberEvent| {
        if matches!(event, MemberEvent::TaskStarted { .. }) {
            *lock(&seen.0) = true;
            seen.1.notify_all();
        }
    });
    let output_topic = output.clone();
    let topology = Topology::new(&app).stage_from_topic("copy", &input, move |task| {
        let output = output_topic.clone();
        Ok(task.records().map(move |r: KafkaRecord| Emit::to_topic(&output, None, r.value.unwrap_or_default())))
    });
    let settings = MemberSettings::new(&brokers(), dir.path(), StreamingSettings::new(Duration::from_millis(200)), "a");
    let member = Member::start(topology, settings, Some(listener)).unwrap();

    // The task looks at the lock again and again while it is held.
    log.wait_for("the task's checkpoint is still held; trying again", 4);
    drop(held);
    let (lock, changed) = &*started;
    let (started, _) =
        changed.wait_timeout_while(lock.lock().unwrap(), StdDuration::from_secs(60), |started| !*started).unwrap();
    assert!(*started, "the task never started once the lock was let go");
    drop(started);
    assert_eq!(log.count("opened the task's Kafka stream"), 1, "one stream for all the looks at the lock");
    member.leave().unwrap();
}
