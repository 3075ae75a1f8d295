//! The two kinds of run: a backlog's throughput on 1, 2 or 3 members, and
//! the pause after a member is killed under a live input.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::members::{
    MemberProcess, Run, cpu_seconds, first_batch_after, given_after, machine_busy_seconds, peak_rss_mb, settled,
};
use super::reference::Windows;
use super::topics::{
    Offsets, PendingOffsets, create_topics, latest_counts, live_producer, produce_backlog, read_all, unique,
};
use super::{BATCH_MS, LIVE_RATE, PARTITIONS, REBALANCE_BATCH_MS, THROUGHPUT_SESSION_MS, WORDS_PER_LINE};

/// One throughput run's figures.
pub(super) struct Throughput {
    pub(super) members: usize,
    pub(super) lines: f64,
    pub(super) without_repartition: bool,
    /// Lines a second from the backlog's first line to everything committed.
    pub(super) rate: f64,
    pub(super) seconds: f64,
    /// How long producing the backlog took (inside `seconds`).
    pub(super) produced_in: f64,
    /// Each member's CPU seconds over the measured time.
    pub(super) cpu: Vec<f64>,
    /// Each member's peak resident memory, MB.
    pub(super) peak_rss: Vec<f64>,
    /// The machine's busy cores over the measured time.
    pub(super) busy_cores: f64,
    /// Whether the group kept its assignment through the run.
    pub(super) stable: bool,
    /// Its windows against the reference (runs with the repartition hop).
    pub(super) windows: Option<Windows>,
}

/// Starts `members` members on a new, empty input topic, waits until
/// they own their tasks, then produces the backlog and times it from its
/// first line until every batch of every stage has committed.
pub(super) fn throughput(spate: &Path, lines: u64, members: usize, without_repartition: bool) -> Throughput {
    let (input, output) = (unique("bench-app-in"), unique("bench-app-out"));
    let late_topic = format!("{output}-late");
    create_topics(&[(&input, PARTITIONS), (&output, 1), (&format!("{output}-top"), 1), (&late_topic, 1)]);
    let output = output.as_str();
    let dir = tempfile::tempdir().unwrap();
    let run = Run {
        spate,
        app: unique("bench-app"),
        input: &input,
        output,
        checkpoint: dir.path(),
        session_ms: THROUGHPUT_SESSION_MS,
        quiet: std::env::var_os("APP_BENCH_LOGS").is_none(),
        without_repartition,
        // The command's default: the count tasks' watermarks follow every
        // split task, so one running ahead makes no word late.
        allowed_lateness_ms: "60000",
        batch_ms: BATCH_MS,
    };
    let topics = run.topics();
    let tasks: usize = topics.iter().map(|(_, n)| *n as usize).sum();
    let mut processes: Vec<MemberProcess> = (1..=members).map(|i| run.start_member(&format!("m{i}"))).collect();
    settled(&mut processes, tasks, Duration::from_secs(120));
    // Every task's context and consumers open, and the producers ready.
    std::thread::sleep(Duration::from_secs(2));
    let owned: Vec<Vec<String>> = processes.iter().map(MemberProcess::owned).collect();
    let offsets = Offsets::new(&run.app, &topics);
    let cpu_at: Vec<f64> = processes.iter().map(|m| cpu_seconds(m.child.id())).collect();
    let machine_at = machine_busy_seconds();
    let started = Instant::now();
    let reference = produce_backlog(&input, lines);
    let produced_in = started.elapsed().as_secs_f64();
    let input_read = |committed: &BTreeMap<(String, i32), i64>| -> i64 {
        committed.iter().filter(|((t, _), _)| *t == input).map(|(_, o)| o).sum()
    };
    let deadline = Instant::now() + Duration::from_secs(if lines > 10_000 { 600 } else { 60 });
    // Every task that writes an internal topic ends each batch with progress
    // marks, so the topics' ends move on while the members run: the run is
    // done when the input is read and, twice over (the stage after each
    // hop), every partition committed up to where it ended before.
    let mut targets: Vec<BTreeMap<(String, i32), i64>> = Vec::new();
    let done = loop {
        let committed = offsets.committed();
        let reached = |target: &BTreeMap<(String, i32), i64>| {
            target.iter().all(|(tp, end)| committed.get(tp).is_some_and(|c| c >= end))
        };
        if input_read(&committed) == lines as i64 && targets.last().is_none_or(reached) {
            if targets.len() == 2 {
                break Instant::now();
            }
            targets.push(offsets.ends());
            continue;
        }
        for member in &mut processes {
            member.check_alive();
        }
        assert!(
            Instant::now() < deadline,
            "{members} member(s): not done in time: committed {committed:?}, ends {:?}\n{}",
            offsets.ends(),
            processes.iter().map(MemberProcess::last_words).collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let cpu: Vec<f64> = processes.iter().zip(&cpu_at).map(|(m, at)| cpu_seconds(m.child.id()) - at).collect();
    let peak_rss: Vec<f64> = processes.iter().map(|m| peak_rss_mb(m.child.id())).collect();
    let machine = machine_busy_seconds();
    let stable = processes.iter().map(MemberProcess::owned).collect::<Vec<_>>() == owned;
    let seconds = (done - started).as_secs_f64();
    for member in processes {
        member.stop();
    }
    let windows = (!without_repartition)
        .then(|| reference.check(&latest_counts(&read_all(output)), read_all(&late_topic).len() as u64));
    Throughput {
        members,
        lines: lines as f64,
        without_repartition,
        rate: lines as f64 / seconds,
        seconds,
        produced_in,
        cpu,
        peak_rss,
        busy_cores: (machine - machine_at) / seconds,
        stable,
        windows,
    }
}

pub(super) fn describe(t: &Throughput) -> String {
    let cpu: Vec<String> = t.cpu.iter().map(|c| format!("{c:.1}")).collect();
    let rss: Vec<String> = t.peak_rss.iter().map(|m| format!("{m:.0}")).collect();
    format!(
        "app: {} member(s){}: {:.0} lines/s ({:.0} words/s), {:.0} lines/s a member, over {:.1} s (the backlog \
         produced in the first {:.1} s); CPU seconds a member: {} ({:.0} lines a member CPU-second); peak RSS a \
         member: {} MB; machine cores busy: {:.2} of {}{}{}",
        t.members,
        if t.without_repartition { ", no repartition" } else { "" },
        t.rate,
        t.rate * WORDS_PER_LINE as f64,
        t.rate / t.members as f64,
        t.seconds,
        t.produced_in,
        cpu.join(" "),
        t.lines / t.cpu.iter().sum::<f64>(),
        rss.join(" "),
        t.busy_cores,
        cores(),
        if t.stable { "" } else { "; the group's assignment changed during the run" },
        t.windows.as_ref().map_or_else(String::new, |w| format!(
            "; windows closed {}, exact {}, written again {}, late words {}",
            w.closed, w.exact, w.revised, w.late_words
        ))
    )
}

pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// One rebalance run's figures.
pub(super) struct Pause {
    pub(super) session_ms: u64,
    /// Kill to the last moved task's first batch under its new owner.
    pub(super) pause_ms: f64,
    /// Per moved task: (task, kill to given to a survivor, kill to its first batch there).
    pub(super) tasks: Vec<(String, f64, f64)>,
    /// Kill to the moved partitions' committed offsets being stable (no
    /// transaction of the killed member holding some pending).
    pub(super) stable_ms: f64,
    /// Records of the run's topics not committed yet at the kill.
    pub(super) lag_at_kill: i64,
}

pub(super) fn rebalance_pause(spate: &Path, output: &str, members: usize, session_ms: u64) -> Pause {
    let input = unique("bench-app-live");
    create_topics(&[(&input, PARTITIONS)]);
    let dir = tempfile::tempdir().unwrap();
    let run = Run {
        spate,
        app: unique("bench-app"),
        input: &input,
        output,
        checkpoint: dir.path(),
        session_ms,
        quiet: false,
        without_repartition: false,
        // The command's default.
        allowed_lateness_ms: "60000",
        batch_ms: REBALANCE_BATCH_MS,
    };
    let tasks: usize = run.topics().iter().map(|(_, n)| *n as usize).sum();
    let mut processes: Vec<MemberProcess> = (1..=members).map(|i| run.start_member(&format!("m{i}"))).collect();
    settled(&mut processes, tasks, Duration::from_secs(120));
    let stop = Arc::new(AtomicBool::new(false));
    let producing = live_producer(input.clone(), Arc::clone(&stop));
    // Steady running before the kill: every stage keeps up with the input.
    let offsets = Offsets::new(&run.app, &run.topics());
    let lag_at_kill = caught_up(&offsets, &mut processes);
    settled(&mut processes, tasks, Duration::from_secs(1));
    let input_tasks = |m: &MemberProcess| m.owned().iter().filter(|t| t.starts_with(&format!("{input}-"))).count();
    let victim = (0..processes.len()).max_by_key(|i| (input_tasks(&processes[*i]), usize::MAX - i)).unwrap();
    let mut victim = processes.remove(victim);
    let moved = victim.owned();
    let pending = PendingOffsets::new(&run.app, &moved);
    let killed = Instant::now();
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    victim.keep_logs();
    let settled_offsets = std::thread::spawn(move || pending.wait());
    let since = |at: Instant| (at - killed).as_secs_f64() * 1000.0;
    let deadline = killed + Duration::from_millis(session_ms) + Duration::from_secs(60);
    let mut found: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    while found.len() < moved.len() {
        for member in &mut processes {
            member.check_alive();
        }
        for task in &moved {
            if let Some(at) = first_batch_after(&processes, task, killed) {
                let given = given_after(&processes, task, killed).map_or(f64::NAN, since);
                found.entry(task.clone()).or_insert((given, since(at)));
            }
        }
        assert!(
            Instant::now() < deadline,
            "session {session_ms} ms: after {:.0} ms, no new owner committed a batch of {:?}",
            since(Instant::now()),
            moved.iter().filter(|t| !found.contains_key(*t)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    producing.join().unwrap();
    for member in processes {
        member.stop();
    }
    let tasks: Vec<(String, f64, f64)> = found.into_iter().map(|(t, (g, b))| (t, g, b)).collect();
    let pause_ms = tasks.iter().map(|(_, _, b)| *b).fold(0.0, f64::max);
    let stable_ms = since(settled_offsets.join().unwrap());
    Pause { session_ms, pause_ms, tasks, stable_ms, lag_at_kill }
}

/// Live input before a member is killed: the members' first batches open
/// their stores and fill their windows, and a member killed in them leaves
/// a backlog its partitions' new owner must first work off.
const WARM_UP: Duration = Duration::from_secs(10);
/// Checks in a row, a second apart, that must find every stage caught up.
const STEADY_CHECKS: u32 = 5;

/// Waits until, [`STEADY_CHECKS`] times in a row a second apart, no
/// partition of the run's topics is more than two seconds of the live input
/// behind (words count eight to a line), after at least [`WARM_UP`] of
/// input; returns the records not yet committed then.
pub(super) fn caught_up(offsets: &Offsets, members: &mut [MemberProcess]) -> i64 {
    let per_partition = (LIVE_RATE / PARTITIONS as u64) as i64;
    let started = Instant::now();
    let mut in_a_row = 0;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        for member in members.iter_mut() {
            member.check_alive();
        }
        let (committed, ends) = (offsets.committed(), offsets.ends());
        let lag: Vec<(String, i64)> =
            ends.iter().map(|(tp, end)| (tp.0.clone(), end - committed.get(tp).copied().unwrap_or(0))).collect();
        let behind = lag.iter().any(|(topic, lag)| {
            let words = if topic.ends_with("-words") { WORDS_PER_LINE as i64 } else { 1 };
            *lag > 2 * per_partition * words
        });
        in_a_row = if behind { 0 } else { in_a_row + 1 };
        if in_a_row >= STEADY_CHECKS && started.elapsed() >= WARM_UP {
            return lag.iter().map(|(_, l)| l).sum();
        }
        assert!(started.elapsed() < Duration::from_secs(90), "the members did not catch up with the input: {lag:?}");
    }
}
