//! `spate run --app` on several member processes against the local broker:
//! the word count's throughput with 1, 2 and 3 members, what its
//! repartition hop costs, and how long a killed member's partitions pause.
//!
//! Figures printed as `BENCH <name> <value> <unit> bound=<value> ratio=<r>`:
//! - `app_repartition_hop_1_member`: input lines a second through the whole
//!   job (split, the hop through `NAME-words`, count per event-time window,
//!   top) on one member; bound: the same job without the hop (the hidden
//!   `--without-repartition`: each input partition counted in its split
//!   task), so the ratio is what the hop leaves of the throughput.
//! - `app_throughput_<n>_members` and `..._per_member`: the same job on 2 and
//!   3 member processes, in total and per member; bound: one member.
//! - `app_rebalance_pause_session_<ms>ms`: from `kill -9` of one of three
//!   members to the last of its partitions' first batch committed by its
//!   new owner, under a live input; bound: the session timeout in force plus
//!   2 s (the target: within 2 s of the group noticing).
//!
//! Every run is a new application (its own consumer group, internal topics
//! and checkpoints) of members started with `--batch-ms 500` (1000, the
//! command's default, in the rebalance runs), a heartbeat of
//! 1 s, 10 s event-time windows and the command's default caps per batch.
//!
//! Throughput: the members start on an empty input topic of 6 partitions;
//! once every member owns its tasks (the members print what they are given),
//! a backlog of `--lines N` lines (400,000; 8 words each from a vocabulary of
//! 200, spread over two minutes of event time) is produced, and the run is
//! timed from its first line until every batch of every stage has committed:
//! the group's committed offsets (each batch's transaction commits them) of
//! the input and of the internal topics reach the topics' ends. Beside it: the
//! CPU each member process used over that time (`/proc/<pid>/stat`), the
//! lines per member CPU-second, each member's peak resident memory, and the
//! machine's busy cores (`/proc/stat`; the broker shares the processors).
//!
//! Rebalance pause: three members start on an empty topic; once they own
//! their tasks, a producer thread writes 3,000 lines a second stamped with
//! the current time, and after ten seconds of it, once no partition of any
//! stage is more than two seconds of input behind five checks in a row, the
//! member with the most input partitions is killed with SIGKILL.
//! The survivors' progress lines (`[<topic>-<partition>] batch …`, printed
//! once the batch committed) say when each of its tasks committed its first
//! batch under its new owner. Also printed: when the killed member's
//! partitions had no offsets pending in a transaction of its any more (a new
//! owner's first transaction waits for that: the broker aborts the dead
//! member's open transaction after `--transaction-timeout-ms`, by default the
//! session timeout, checking for such transactions every second on the broker
//! `cargo xtask kafka start` runs, every 10 s on a broker left at its
//! defaults).
//!
//! Needs the broker in `SPATE_KAFKA_BROKERS` (`cargo xtask bench app`
//! starts one) and the `spate` binary to run (`--spate PATH`). Built with
//! xtask's `app-bench` feature (it brings rdkafka, which the other commands
//! do without): `cargo xtask bench app` builds and runs it with `--full`;
//! `cargo xtask test` runs the short check, without `--full`, where the
//! backlog is 3,000 lines, only the one-member runs and one pause (session
//! 6 s, two members) run, and no figure is printed. Arguments `throughput`,
//! `hop` and `rebalance` pick parts; with `APP_BENCH_LOGS=DIR` each member's
//! output is kept in `DIR/<app>-<member>.out` and `.err` (and the
//! throughput runs' members print their batches).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod members;
mod reference;
mod runs;
mod topics;

use std::path::PathBuf;
use std::process::ExitCode;

use runs::{cores, describe, rebalance_pause, throughput};
use topics::{brokers, create_topics, unique};

const PARTITIONS: i32 = 6;
const WORDS_PER_LINE: u64 = 8;
const VOCABULARY: usize = 200;
/// The backlog's lines are spread over this much event time.
const EVENT_SPAN_MS: i64 = 120_000;
const WINDOW_MS: &str = "10000";
/// The members' bound on out-of-orderness.
const OUT_OF_ORDERNESS_MS: &str = "2000";
/// The batches of the throughput runs.
const BATCH_MS: &str = "500";
/// The batches of the rebalance runs: the command's default. With 500 ms
/// batches the fifteen tasks of three members and the broker, each batch a
/// transaction, fill this machine's two cores and the count tasks fall
/// behind before any member is killed, so a pause would measure their
/// backlog, not the rebalance.
const REBALANCE_BATCH_MS: &str = "1000";
/// The heartbeat of every run.
const HEARTBEAT_MS: u64 = 1_000;
/// The session of the throughput runs (no member dies in them).
const THROUGHPUT_SESSION_MS: u64 = 10_000;
/// The live input of the rebalance runs, lines a second over all partitions.
const LIVE_RATE: u64 = 3_000;
const PARTS: [&str; 3] = ["throughput", "hop", "rebalance"];

struct Options {
    /// The `spate` binary the members run.
    spate: PathBuf,
    full: bool,
    lines: u64,
    parts: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let full = args.iter().any(|a| a == "--full");
        let lines = if full { 400_000 } else { 3_000 };
        let mut options = Options { spate: PathBuf::new(), full, lines, parts: Vec::new() };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--lines" => {
                    options.lines = args.next().and_then(|n| n.parse().ok()).ok_or("--lines takes a number")?;
                }
                "--spate" => options.spate = args.next().ok_or("--spate takes the binary's path")?.into(),
                "--full" => {}
                a if a.starts_with('-') => return Err(format!("no option {a}")),
                name if PARTS.contains(&name) => options.parts.push(name.to_string()),
                name => return Err(format!("no part named {name} (there are {})", PARTS.join(", "))),
            }
        }
        if !options.spate.is_file() {
            return Err(format!("no spate binary at `{}` (--spate PATH)", options.spate.display()));
        }
        Ok(options)
    }

    fn selects(&self, part: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == part)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match Options::parse(&args) {
        Ok(options) => {
            run(&options);
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("app-bench: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the parts `options` selects.
fn run(options: &Options) {
    let spate = options.spate.as_path();
    let brokers = brokers();
    let output = unique("bench-app-out");
    create_topics(&[(&output, 1), (&format!("{output}-top"), 1), (&format!("{output}-late"), 1)]);
    println!(
        "app: {} cores; broker {brokers}; batches of {BATCH_MS} ms ({REBALANCE_BATCH_MS} ms in the rebalance runs), {WINDOW_MS} ms event-time windows, heartbeat \
         {HEARTBEAT_MS} ms",
        cores()
    );
    let (mut runs, mut pauses) = (Vec::new(), Vec::new());
    if options.selects("throughput") || options.selects("hop") {
        let mut counts = vec![(1, false)];
        if options.selects("hop") {
            counts.push((1, true));
        }
        if options.selects("throughput") && options.full {
            counts.extend([(2, false), (3, false)]);
        }
        println!(
            "app: each run a new application on a new input topic; once its members own their tasks, a backlog of {} \
             lines ({WORDS_PER_LINE} words each) in {PARTITIONS} partitions",
            options.lines
        );
        for (members, without) in counts {
            let run = throughput(spate, options.lines, members, without);
            println!("{}", describe(&run));
            if let Some(w) = &run.windows {
                // With the command's default lateness, every closed window
                // is exact and no word is late, however the split tasks
                // run their backlogs.
                assert!(
                    w.closed > 0 && w.exact == w.closed && w.late_words == 0 && w.revised == 0,
                    "{members} member(s): {w:?}"
                );
            }
            runs.push(run);
        }
    }
    if options.selects("rebalance") {
        let (members, sessions): (usize, &[u64]) = if options.full { (3, &[6_000, 10_000]) } else { (2, &[6_000]) };
        for &session in sessions {
            let pause = rebalance_pause(spate, &output, members, session);
            let detail: Vec<String> =
                pause.tasks.iter().map(|(t, g, b)| format!("{t} given +{g:.0} ms, first batch +{b:.0} ms")).collect();
            println!(
                "app: session {session} ms, transaction timeout {session} ms, {members} members, one \
                 killed ({} records behind): {}; its partitions' offsets stable +{:.0} ms",
                pause.lag_at_kill,
                detail.join("; "),
                pause.stable_ms
            );
            pauses.push(pause);
        }
    }
    if !options.full {
        println!("app: not run with --full, no figures");
        return;
    }
    let rate = |members: usize, without: bool| {
        runs.iter().find(|r| r.members == members && r.without_repartition == without).map(|r| r.rate)
    };
    if let (Some(hop), Some(no_hop)) = (rate(1, false), rate(1, true)) {
        println!("BENCH app_repartition_hop_1_member {hop:.0} lines/s bound={no_hop:.0} ratio={:.3}", hop / no_hop);
    }
    for run in &runs {
        if let Some(w) = &run.windows {
            println!(
                "BENCH app_exact_windows_{}_members {} windows bound={} ratio={:.3}",
                run.members,
                w.exact,
                w.closed,
                w.exact as f64 / w.closed.max(1) as f64
            );
        }
    }
    if let Some(one) = rate(1, false) {
        for members in [2, 3] {
            if let Some(total) = rate(members, false) {
                println!(
                    "BENCH app_throughput_{members}_members {total:.0} lines/s bound={one:.0} ratio={:.3}",
                    total / one
                );
                let each = total / members as f64;
                println!(
                    "BENCH app_throughput_{members}_members_per_member {each:.0} lines/s bound={one:.0} ratio={:.3}",
                    each / one
                );
            }
        }
    }
    for p in &pauses {
        let bound = p.session_ms as f64 + 2_000.0;
        println!(
            "BENCH app_rebalance_pause_session_{}ms {:.0} ms bound={bound:.0} ratio={:.3}",
            p.session_ms,
            p.pause_ms,
            p.pause_ms / bound
        );
    }
}
