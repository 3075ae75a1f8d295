//! A member's life against the local broker: dropped without leaving, it
//! stops its tasks and leaves the group; a second live member under its id
//! is refused at start, while a run that died gives its id back; a task
//! whose pipeline is refused stops the member with that error.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration as StdDuration, Instant};

use spate_core::sync::lock;

use common::{brokers, unique};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use spate_app::{Emit, Member, MemberEvent, MemberSettings, Topology};
use spate_core::Duration;
use spate_kafka::{GroupSettings, KafkaRecord};
use spate_runtime::StreamingSettings;

/// Copies each record of `input` to `output`.
fn copy(app: &str, input: &str, output: &str) -> Topology {
    let output = output.to_string();
    Topology::new(app).stage_from_topic("copy", input, move |task| {
        let output = output.clone();
        Ok(task.records().map(move |r: KafkaRecord| Emit::to_topic(&output, None, r.value.unwrap_or_default())))
    })
}

fn settings(location: &std::path::Path, member: &str) -> MemberSettings {
    let mut s = MemberSettings::new(&brokers(), location, StreamingSettings::new(Duration::from_millis(200)), member);
    s.group = GroupSettings {
        session_timeout: StdDuration::from_secs(6),
        heartbeat_interval: StdDuration::from_secs(1),
        ..GroupSettings::default()
    };
    s
}

/// Every event a member reports, for waiting on.
#[derive(Default)]
struct Events {
    seen: Mutex<Vec<MemberEvent>>,
    changed: Condvar,
}

impl Events {
    fn listener(self: &Arc<Self>) -> spate_app::MemberListener {
        let events = Arc::clone(self);
        Arc::new(move |event: &MemberEvent| {
            lock(&events.seen).push(event.clone());
            events.changed.notify_all();
        })
    }

    /// Waits (failing after a minute) until `count` of the events seen is `n` or more.
    fn wait_for(&self, what: &str, n: usize, count: impl Fn(&MemberEvent) -> bool) {
        let deadline = Instant::now() + StdDuration::from_secs(60);
        let mut seen = self.seen.lock().unwrap();
        while seen.iter().filter(|e| count(e)).count() < n {
            let left = deadline.checked_duration_since(Instant::now()).unwrap_or_else(|| panic!("timed out: {what}"));
            seen = self.changed.wait_timeout(seen, left).unwrap().0;
        }
    }
}

/// The members the broker lists in `group`.
fn group_members(group: &str) -> usize {
    let client: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let groups = client.fetch_group_list(Some(group), StdDuration::from_secs(10)).unwrap();
    groups.groups().iter().map(|g| g.members().len()).sum()
}

/// The names of this process's threads (Linux: `/proc/self/task/*/comm`).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .map(|task| std::fs::read_to_string(task.unwrap().path().join("comm")).unwrap_or_default().trim().to_string())
        .collect()
}

#[test]
fn a_member_dropped_without_leaving_stops_its_tasks_and_leaves_the_group() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info,rdkafka=warn").try_init();
    let (input, output, app) = (unique("dropped-in"), unique("dropped-out"), unique("dropped"));
    spate_kafka::ensure_topic(&brokers(), &input, 2).unwrap();
    spate_kafka::ensure_topic(&brokers(), &output, 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let events = Arc::new(Events::default());
    let member =
        Member::start(copy(&app, &input, &output), settings(dir.path(), "a"), Some(events.listener())).unwrap();
    events.wait_for("both tasks started", 2, |e| matches!(e, MemberEvent::TaskStarted { .. }));
    assert_eq!(group_members(&app), 1);
    // The membership's poll thread, named after the group (cut to 15 bytes, unique in this binary).
    let poll_thread: String = format!("spate-group-{app}").chars().take(15).collect();
    assert!(thread_names().contains(&poll_thread), "{poll_thread} runs: {:?}", thread_names());

    drop(member);
    assert!(!thread_names().contains(&poll_thread), "the group's poll thread ended with the member");
    events.wait_for("both tasks stopped", 2, |e| matches!(e, MemberEvent::TaskStopped { .. }));
    let deadline = Instant::now() + StdDuration::from_secs(60);
    while group_members(&app) > 0 {
        assert!(Instant::now() < deadline, "the dropped member is still in the group after a minute");
    }
}

/// A second process started under a member id a live member uses would
/// fence that member's producer, and be fenced back, for as long as both run.
fn a_second_member_under_a_live_members_id_is_refused(
    protocol: spate_kafka::GroupProtocol,
    location: &std::path::Path,
    object_store: &spate_logstore::ObjectStoreSettings,
) {
    let (input, output, app) = (unique("twin-in"), unique("twin-out"), unique("twin"));
    spate_kafka::ensure_topic(&brokers(), &input, 2).unwrap();
    spate_kafka::ensure_topic(&brokers(), &output, 1).unwrap();
    let with_protocol = |member: &str| {
        let mut s = settings(location, member);
        s.group.protocol = protocol;
        s.object_store = object_store.clone();
        s
    };
    let events = Arc::new(Events::default());
    let first = Member::start(copy(&app, &input, &output), with_protocol("m1"), Some(events.listener())).unwrap();
    events.wait_for("the first member's tasks started", 2, |e| matches!(e, MemberEvent::TaskStarted { .. }));

    let second = Member::start(copy(&app, &input, &output), with_protocol("m1"), None);
    let error = second.expect_err("a second live member named m1 is refused").to_string();
    assert!(error.contains("m1") && error.contains("another live member"), "{error}");
    // The first member was not fenced: it still runs both tasks.
    assert_eq!(first.tasks().len(), 2);
    assert!(!events.seen.lock().unwrap().iter().any(|e| matches!(e, MemberEvent::TaskFailed { .. })));
    // Once it has left, the name is free again.
    first.leave().unwrap();
    Member::start(copy(&app, &input, &output), with_protocol("m1"), None).unwrap().leave().unwrap();
}

#[test]
fn a_second_member_under_a_live_members_id_is_refused_cooperatively() {
    let dir = tempfile::tempdir().unwrap();
    let local = spate_logstore::ObjectStoreSettings::default();
    a_second_member_under_a_live_members_id_is_refused(
        spate_kafka::GroupProtocol::CooperativeSticky,
        dir.path(),
        &local,
    );
}

#[test]
fn a_second_member_under_a_live_members_id_is_refused_by_the_broker_side_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let local = spate_logstore::ObjectStoreSettings::default();
    a_second_member_under_a_live_members_id_is_refused(spate_kafka::GroupProtocol::Consumer, dir.path(), &local);
}

#[test]
fn a_second_member_under_a_live_members_id_is_refused_on_s3() {
    let (location, object_store) = s3_location();
    a_second_member_under_a_live_members_id_is_refused(
        spate_kafka::GroupProtocol::CooperativeSticky,
        &location,
        &object_store,
    );
}

/// The S3 server of the tests; fails (never skips) when none is configured.
fn s3_location() -> (std::path::PathBuf, spate_logstore::ObjectStoreSettings) {
    let endpoint = std::env::var("SPATE_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "SPATE_TEST_S3_ENDPOINT is not set: this test needs an S3 server. Run it with `cargo xtask test`, \
             or start one with `cargo xtask s3 start` and export what it prints"
        )
    });
    let var = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
    let settings = spate_logstore::ObjectStoreSettings {
        endpoint: Some(endpoint),
        region: Some(var("AWS_REGION", "us-east-1")),
        access_key_id: Some(var("AWS_ACCESS_KEY_ID", "spate-test")),
        secret_access_key: Some(var("AWS_SECRET_ACCESS_KEY", "spate-test-secret")),
        allow_http: Some(true),
    };
    let bucket = var("SPATE_TEST_S3_BUCKET", "spate-test");
    (std::path::PathBuf::from(format!("s3://{bucket}/tests/{}", unique("member-id"))), settings)
}

#[test]
fn a_member_restarted_after_a_crash_on_s3_takes_its_id_back_once_the_dead_runs_lease_ran_out() {
    let (input, output, app) = (unique("crashed-in"), unique("crashed-out"), unique("crashed"));
    spate_kafka::ensure_topic(&brokers(), &input, 1).unwrap();
    spate_kafka::ensure_topic(&brokers(), &output, 1).unwrap();
    let (location, object_store) = s3_location();
    // An earlier run of m1 died holding its member lease: nobody renews it, nobody releases it.
    {
        let files = spate_logstore::file_manager_for(&location, &object_store).unwrap();
        let dir = location.join("members").join("m1");
        let lease = spate_logstore::LeaseSettings {
            duration: Duration::from_secs(6),
            renew_every: Duration::from_millis(1_500),
            safety_margin: Duration::from_millis(1_200),
            renew_in_background: false,
        };
        let dead = files.acquire_lock(&dir, Arc::new(spate_core::SystemClock), &lease).unwrap();
        std::mem::forget(dead);
    }
    let mut restarted = settings(&location, "m1");
    restarted.object_store = object_store;
    let member = Member::start(copy(&app, &input, &output), restarted, None)
        .expect("the restarted member waits for the dead run's lease to run out, then takes its id");
    member.leave().unwrap();
}

#[test]
fn a_task_whose_pipeline_is_refused_stops_the_member_with_the_error_instead_of_trying_again() {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("info,rdkafka=warn").try_init();
    let (input, app) = (unique("refused-in"), unique("refused"));
    spate_kafka::ensure_topic(&brokers(), &input, 1).unwrap();
    // An hour sliding by a millisecond: 3.6 million windows a record.
    let topology = Topology::new(&app).stage_from_topic("count", &input, |task| {
        let counts = task
            .records()
            .map(|r: KafkaRecord| (r.partition, r.timestamp.unwrap_or_default()))
            .aggregate_by_event_time(
                |ts: &i64| spate_core::Time::from_millis(*ts),
                spate_dstream::Watermarks::bounded_out_of_orderness(Duration::ZERO),
                spate_dstream::EventWindows::sliding(Duration::from_millis(3_600_000), Duration::from_millis(1)),
                |_| 1u64,
                |n: &mut u64, _| *n += 1,
                |n: &mut u64, m: &u64| *n += m,
            )
            .name("counts");
        Ok(counts.results().map(|r| Emit::to_topic("out", None, r.value.to_string().into_bytes())))
    });
    let dir = tempfile::tempdir().unwrap();
    let events = Arc::new(Events::default());
    let member = Member::start(topology, settings(dir.path(), "a"), Some(events.listener())).unwrap();
    events.wait_for("the task failed for good", 1, |e| matches!(e, MemberEvent::Failed { .. }));
    let failure = member.failure().expect("the member says why it must stop");
    assert!(failure.contains("3600000 windows") && failure.contains("at most 1000"), "{failure}");
    // The task stops after it has said why (the event comes from its own thread).
    events.wait_for("the refused task stopped", 1, |e| matches!(e, MemberEvent::TaskStopped { .. }));
    let seen = events.seen.lock().unwrap().clone();
    let retried = seen.iter().filter(|e| matches!(e, MemberEvent::TaskFailed { .. })).count();
    assert_eq!(retried, 0, "the refused task was tried again: {seen:?}");
    member.leave().unwrap();
}
