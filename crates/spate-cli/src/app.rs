//! `spate run --app NAME`: the word count as one member of an application.
//!
//! Every process started with the same `--app`, brokers and `--checkpoint`
//! is a member of one application; the topic's partitions are spread over
//! them by the Kafka consumer group `NAME`. Three stages:
//!
//! 1. `split`, a task per input partition: the words of each record, with
//!    the record's timestamp, sent on by word (internal topic `NAME-words`);
//! 2. `count`, a task per partition of `NAME-words`: each word counted over
//!    event-time windows (`--window-ms` sliding by `--slide-ms`, records
//!    up to `--allowed-lateness-ms` late still counted), each window's count
//!    written to `--output-topic` when the watermark passes its end and
//!    again when late records change it (`revision` 1, 2, …);
//! 3. `top`, one task over every window count (internal topic `NAME-windows`,
//!    one partition): each window's top `--top` words, written to
//!    `--top-topic` whenever they change. All window counts go through this
//!    one task, on whichever member owns it: its cost grows with the
//!    number of words and windows, not with the number of members.
//!
//! Every batch of every task is one Kafka transaction with its offsets, so
//! the output read with `read_committed` holds each count once.
//!
//! The hidden `--without-repartition` is a benchmark knob: `split` counts
//! its own partition's words (one stage `split-count`, no `NAME-words`), so
//! each count is of one input partition only. The app benchmark runs both
//! to measure the repartition hop's cost.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration as StdDuration;

use serde_json::json;
use spate_app::{AppError, Emit, Member, MemberEvent, MemberSettings, TaskBuilder, TaskId, Topology};
use spate_core::sync::lock;
use spate_core::{Duration, Time};
use spate_dstream::{DStream, EventWindows, State, Watermarks};
use spate_kafka::{GroupProtocol, GroupSettings, KafkaRecord};

use crate::args::{AppArgs, RunArgs};
use crate::error::CliError;
use crate::job::{Lines, progress_line};
use crate::kafka::starting_offsets;
use crate::location::object_store_settings;
use crate::signals::{listen, say};

/// A word's count in one window, as the `count` stage sends it to `top`:
/// (word, window end, count, revision).
type WindowCount = (String, i64, u64, u32);

/// The words of a record with its timestamp (0 for a record without one).
fn stamped_words(record: &KafkaRecord) -> Vec<(String, (i64, u64))> {
    let ts = record.timestamp.unwrap_or_default();
    crate::kafka::words_of(record).into_iter().map(|w| (w, (ts, 1))).collect()
}

fn topology(args: &RunArgs, app: &AppArgs, name: &str) -> Topology {
    let top_topic = app.top_topic(&args.output_topic);
    let windows = EventWindows::sliding(Duration::from_millis(app.window_ms), Duration::from_millis(app.slide_ms))
        .allowed_lateness(Duration::from_millis(app.allowed_lateness_ms));
    let mut watermarks = Watermarks::bounded_out_of_orderness(Duration::from_millis(app.out_of_orderness_ms))
        .with_max_future(Duration::from_millis(app.max_future_ms));
    if let Some(idle) = app.idle_timeout_ms {
        watermarks = watermarks.with_idle_timeout(Duration::from_millis(idle));
    }
    let counts = WindowCounts { output: args.output_topic.clone(), late: app.late_topic.clone(), windows, watermarks };
    let (top, keep) = (usize::try_from(args.top).unwrap_or(usize::MAX), app.window_ms + app.allowed_lateness_ms);
    let topology = if app.without_repartition {
        // The benchmark's variant: no hop, each input partition counted alone.
        Topology::new(name).stage_from_topic("split-count", &args.topic, move |task| {
            let words = task.records().flat_map(|r: KafkaRecord| stamped_words(&r));
            counts.declare(task, &words)
        })
    } else {
        Topology::new(name)
            .stage_from_topic("split", &args.topic, |task| {
                let words = task.records().flat_map(|r: KafkaRecord| stamped_words(&r));
                task.repartition_by_key("words", &words, |(ts, _)| Some(Time::from_millis(*ts)))
            })
            .stage_from_repartition("count", "words", move |task| {
                // The words with every split task's progress: a split task
                // ahead of the others makes none of their words late.
                let words = task.repartitioned::<String, (i64, u64)>().records();
                counts.declare(task, &words)
            })
    };
    topology.single_stage("top", "windows", move |task| {
        let top_topic = top_topic.clone();
        let tops = task
            .repartitioned::<i64, WindowCount>()
            .records()
            .map_with_state(
                move |start: &i64, count: Option<WindowCount>, state: &mut State<WindowTop>| {
                    update_top(*start, count, state, top)
                },
                Some(Duration::from_millis(keep.saturating_mul(2))),
            )
            .name("window-top")
            .mapped()
            .flat_map(|changed| changed)
            // The last change of each window in the batch.
            .reduce_by_key(|a, b| if a.0 >= b.0 { a.clone() } else { b.clone() });
        Ok(tops.map(move |(start, (_, end, words))| {
            let value = json!({"windowStart": start, "windowEnd": end, "top": words});
            Emit::to_topic(&top_topic, Some(start.to_string().into_bytes()), value.to_string().into_bytes())
        }))
    })
}

/// The `count` stage: each word counted over event-time windows, each
/// window's count to the output topic and on to `top`.
#[derive(Clone)]
struct WindowCounts {
    output: String,
    late: Option<String>,
    windows: EventWindows,
    watermarks: Watermarks,
}

impl WindowCounts {
    /// Declares the counts of `words` (word, (timestamp, 1)) in `task`.
    fn declare(
        &self,
        task: &mut TaskBuilder<'_>,
        words: &DStream<(String, (i64, u64))>,
    ) -> Result<DStream<Emit>, AppError> {
        let windowed = words
            .aggregate_by_event_time(
                |(ts, _): &(i64, u64)| Time::from_millis(*ts),
                self.watermarks,
                self.windows,
                |(_, n)| n,
                |acc: &mut u64, (_, n)| *acc += n,
                |acc: &mut u64, other: &u64| *acc += other,
            )
            .name("window-counts");
        let counts = windowed.results();
        let output = self.output.clone();
        let written = counts.map(move |r| {
            let (start, end) = (r.window.start.as_millis(), r.window.end.as_millis());
            let value = json!({"word": r.key, "windowStart": start, "windowEnd": end, "count": r.value, "revision": r.revision});
            Emit::to_topic(&output, Some(format!("{}@{start}", r.key).into_bytes()), value.to_string().into_bytes())
        });
        let to_top =
            counts.map(|r| (r.window.start.as_millis(), (r.key, r.window.end.as_millis(), r.value, r.revision)));
        let mut emitted = written.union(&task.repartition_by_key("windows", &to_top, |_| None)?);
        if let Some(topic) = self.late.clone() {
            let late = windowed.late().map(move |(word, (ts, n))| {
                let value = json!({"word": word, "timestamp": ts, "count": n});
                Emit::to_topic(&topic, Some(word.into_bytes()), value.to_string().into_bytes())
            });
            emitted = emitted.union(&late);
        }
        Ok(emitted)
    }
}

/// The `top` stage's state of one window: each word's latest count (by
/// revision), and how many changes it has seen.
type WindowTop = (BTreeMap<String, (u32, u64)>, u64);

/// One window's top words after `count`, with a change number, when it changed.
type TopChange = Option<(i64, (u64, i64, Vec<(String, u64)>))>;

fn update_top(start: i64, count: Option<WindowCount>, state: &mut State<WindowTop>, top: usize) -> TopChange {
    let (word, end, n, revision) = count?;
    let (mut words, changes) = state.get().cloned().unwrap_or_default();
    let newer = words.get(&word).is_none_or(|(seen, _)| revision >= *seen);
    if newer {
        words.insert(word, (revision, n));
    }
    let mut ranked: Vec<(String, u64)> = words.iter().map(|(w, (_, n))| (w.clone(), *n)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    ranked.truncate(top);
    state.update((words, changes + 1));
    Some((start, (changes + 1, end, ranked)))
}

/// Prints what the member does: the tasks it owns, one line a task's batch.
struct MemberLines {
    lines: Arc<Lines>,
    quiet: bool,
    member: String,
    owned: Mutex<Vec<TaskId>>,
}

impl MemberLines {
    fn on_event(&self, event: &MemberEvent) {
        match event {
            MemberEvent::Assigned { tasks } | MemberEvent::Revoked { tasks, .. } if !tasks.is_empty() => {
                let mut owned = lock(&self.owned);
                match event {
                    MemberEvent::Assigned { .. } => owned.extend(tasks.iter().cloned()),
                    _ => owned.retain(|t| !tasks.contains(t)),
                }
                owned.sort();
                let names: Vec<String> = owned.iter().map(ToString::to_string).collect();
                let verb = if matches!(event, MemberEvent::Assigned { .. }) { "given" } else { "gave up" };
                let changed: Vec<String> = tasks.iter().map(ToString::to_string).collect();
                self.lines.say(&format!(
                    "member {} {verb} {}; owns {}",
                    self.member,
                    changed.join(", "),
                    if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
                ));
            }
            MemberEvent::TaskStarted { task, recovery } => self.lines.say(&format!("[{task}] {recovery}")),
            MemberEvent::TaskFailed { task, error } => say(&format!("[{task}] failed, starting again: {error}")),
            MemberEvent::Failed { task, error } => say(&format!("[{task}] failed for good, the member stops: {error}")),
            MemberEvent::Batch { task, progress } if !self.quiet => {
                self.lines.say(&format!("[{task}] {}", progress_line(progress)));
            }
            _ => {}
        }
    }
}

fn member_settings(args: &RunArgs, app: &AppArgs) -> Result<MemberSettings, CliError> {
    let member_id = app.member_id.clone().unwrap_or_else(default_member_id);
    let object_store = object_store_settings(&args.s3)?;
    // The tasks' streaming settings, checked as a job's would be: the member passes them on.
    let job = crate::kafka::run_settings(args, &object_store)?;
    let mut settings = MemberSettings::new(&args.kafka, &args.checkpoint, job, &member_id);
    settings.object_store = object_store;
    settings.group = GroupSettings {
        session_timeout: StdDuration::from_millis(app.session_timeout_ms),
        heartbeat_interval: StdDuration::from_millis(app.heartbeat_interval_ms),
        protocol: if app.group_protocol == "consumer" {
            GroupProtocol::Consumer
        } else {
            GroupProtocol::CooperativeSticky
        },
        client_id: None,
    };
    settings.transaction_timeout = StdDuration::from_millis(app.transaction_timeout_ms());
    settings.starting_offsets = starting_offsets(&args.starting_offsets)?;
    settings.max_rate_per_partition = args.max_rate_per_partition;
    settings.max_future = Duration::from_millis(app.max_future_ms);
    settings.metrics_addr = args.watch.metrics_addr;
    settings.ui_addr = args.watch.ui;
    Ok(settings)
}

/// `<host>-<pid>`: unique among the members of one machine.
fn default_member_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("{}-{}", if host.is_empty() { "host" } else { &host }, std::process::id())
}

/// Runs one member until a signal or `--seconds`, then leaves the group.
pub(crate) fn run(args: &RunArgs, app: &AppArgs, name: &str) -> Result<String, CliError> {
    app.validate()?;
    if app.transaction_timeout_ms() > app.session_timeout_ms && app.group_protocol == "classic" {
        say(&format!(
            "warning: --transaction-timeout-ms {} is longer than --session-timeout-ms {}: the partitions of a member \
             that dies with a transaction open wait for the broker to abort it, past the moment the group moves them",
            app.transaction_timeout_ms(),
            app.session_timeout_ms
        ));
    }
    let settings = member_settings(args, app)?;
    let member_id = settings.member_id.clone();
    let printer = Arc::new(MemberLines {
        lines: Arc::new(Lines::default()),
        quiet: args.quiet,
        member: member_id.clone(),
        owned: Mutex::new(Vec::new()),
    });
    let events = Arc::clone(&printer);
    let stop = Arc::new(Stop::default());
    let failed = Arc::clone(&stop);
    let listener = move |event: &MemberEvent| {
        events.on_event(event);
        if let MemberEvent::Failed { task, error } = event {
            failed.set(Stopped::Failed(format!("task {task}: {error}")));
        }
    };
    let member = Member::start(topology(args, app, name), settings, Some(Arc::new(listener)))
        .map_err(|e| CliError::App { source: Box::new(e) })?;
    say(&format!("member {member_id} of application {name} started; checkpoints under {}", args.checkpoint.display()));
    if let Some(addr) = member.metrics_addr() {
        say(&format!("metrics: http://{addr}/metrics"));
    }
    if let Some(addr) = member.ui_addr() {
        say(&format!("web page: http://{addr}/"));
    }
    if let Stopped::Failed(reason) = wait_for_stop(args.seconds, &stop)? {
        // The other tasks still commit what they ran before the member goes.
        if let Err(error) = member.leave() {
            say(&format!("leaving the application after the failure: {error}"));
        }
        return Err(CliError::App { source: Box::new(AppError::Invalid { app: name.to_string(), reason }) });
    }
    member.leave().map_err(|e| CliError::App { source: Box::new(e) })?;
    Ok(format!("member {member_id} left application {name}: its tasks committed and went to the other members"))
}

/// Why a member stops.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Stopped {
    /// A signal, or `--seconds` elapsed.
    Asked,
    /// A task failed for good.
    Failed(String),
}

/// The first reason to stop, and the wait for it.
#[derive(Default)]
struct Stop {
    reason: Mutex<Option<Stopped>>,
    changed: Condvar,
}

impl Stop {
    fn set(&self, reason: Stopped) {
        lock(&self.reason).get_or_insert(reason);
        self.changed.notify_all();
    }
}

/// Returns on the first SIGINT or SIGTERM, after `seconds`, or when a task
/// failed for good.
fn wait_for_stop(seconds: Option<u64>, stop: &Arc<Stop>) -> Result<Stopped, CliError> {
    let on_signal = Arc::clone(stop);
    let _signals = listen(move || on_signal.set(Stopped::Asked))?;
    let deadline = seconds.map(|s| std::time::Instant::now() + StdDuration::from_secs(s));
    let mut reason = lock(&stop.reason);
    while reason.is_none() {
        let wait = match deadline {
            Some(deadline) => match deadline.checked_duration_since(std::time::Instant::now()) {
                Some(left) if !left.is_zero() => left,
                _ => {
                    say(&format!("--seconds {} elapsed: leaving the application gracefully", seconds.unwrap_or(0)));
                    return Ok(Stopped::Asked);
                }
            },
            None => StdDuration::from_secs(3600),
        };
        reason = stop.changed.wait_timeout(reason, wait).unwrap_or_else(PoisonError::into_inner).0;
    }
    Ok(reason.clone().unwrap_or(Stopped::Asked))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

    fn topology_of(flags: &[&str]) -> String {
        let argv =
            [&["spate", "run", "--kafka", "k:9092", "--topic", "lines", "--output-topic", "o"][..], flags].concat();
        let Command::Run(run) = Cli::try_parse_from(argv).unwrap().command else { panic!("not run") };
        format!("{:?}", topology(&run, &run.app, "wc"))
    }

    fn app_args_of(flags: &[&str]) -> AppArgs {
        let argv =
            [&["spate", "run", "--kafka", "k:9092", "--topic", "lines", "--output-topic", "o"][..], flags].concat();
        let Command::Run(run) = Cli::try_parse_from(argv).unwrap().command else { panic!("not run") };
        run.app
    }

    #[test]
    fn a_window_shape_that_puts_a_word_in_too_many_windows_is_refused_naming_the_limit() {
        let dense = app_args_of(&["--app", "wc", "--window-ms", "3600000", "--slide-ms", "1"]);
        let error = dense.validate().unwrap_err();
        assert_eq!(error.exit_code(), crate::error::ExitCode::Usage);
        let message = error.to_string();
        assert!(message.contains("3600000 windows") && message.contains("at most 1000"), "{message}");
        assert!(app_args_of(&["--app", "wc", "--window-ms", "1000000", "--slide-ms", "1000"]).validate().is_ok());
    }

    #[test]
    fn the_transaction_timeout_follows_the_session_unless_given() {
        let follows = app_args_of(&["--app", "wc", "--session-timeout-ms", "6000"]);
        assert_eq!(follows.transaction_timeout_ms(), 6000);
        let given = app_args_of(&["--app", "wc", "--session-timeout-ms", "6000", "--transaction-timeout-ms", "20000"]);
        assert_eq!(given.transaction_timeout_ms(), 20000);
    }

    #[test]
    fn without_repartition_counts_in_the_split_stage_and_keeps_top() {
        let usual = topology_of(&["--app", "wc"]);
        assert!(usual.contains("\"split\"") && usual.contains("Repartition(\"words\")"), "{usual}");
        let one_stage = topology_of(&["--app", "wc", "--without-repartition"]);
        assert!(one_stage.contains("\"split-count\"") && !one_stage.contains("words"), "{one_stage}");
        assert!(one_stage.contains("Single(\"windows\")"), "{one_stage}");
    }
}
