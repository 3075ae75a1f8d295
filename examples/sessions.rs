//! Sessions per user with `map_with_state` and an inactivity timeout: a
//! user's clicks make one session until the user is idle for longer than
//! the timeout; the session is then closed and emitted.
//!
//! What it shows:
//!
//! - `map_with_state` with a timeout: the function sees each click with the
//!   user's session state, and once more, with no click and
//!   `State::is_timing_out`, when the user has been idle for longer than the
//!   timeout: that call emits the closed session;
//! - `state_snapshots`: every open session after each batch;
//! - a replayable input of your own ([`InputSource`]): the clicks of a batch
//!   are a function of the batch's number, which is what `plan` returns and
//!   the runtime logs to `offsets/N`, so a re-run after a crash reads the
//!   same clicks, and a restart continues the numbering (the `on_resume` hook);
//! - stateful operators need a checkpoint directory: the sessions survive a
//!   restart (run it twice with the same `--checkpoint`).
//!
//! ```sh
//! cargo run --example sessions -- --seconds 15
//! ```
//!
//! Users click in bursts (three to five batches of clicks, then as many idle
//! batches), so with the default two-batch timeout every burst is a session.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use clap::Parser;
use serde::{Deserialize, Serialize};
use spate::core::{Duration, Time};
use spate::dstream::{BatchLimits, BoxError, InputSource, State};
use spate::runtime::{OffsetsHook, PipelineBuilder, StreamingContext, StreamingSettings};

use common::{Error, run_until};

/// User sessions closed after inactivity, on generated clicks.
#[derive(Clone, Debug, Parser)]
struct Args {
    /// The checkpoint directory (the open sessions are kept in it).
    #[arg(long, default_value = "sessions-checkpoint")]
    checkpoint: PathBuf,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Users clicking.
    #[arg(long, default_value_t = 5)]
    users: u64,
    /// Batches with clicks; after them the source is quiet, and the example
    /// stops once every session has timed out (default: clicks without end).
    #[arg(long)]
    input_batches: Option<u64>,
    /// The batch interval, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    batch_ms: u64,
    /// A session closes after this many idle batch intervals.
    #[arg(long, default_value_t = 2)]
    timeout_batches: u64,
    /// Print nothing per session.
    #[arg(long)]
    quiet: bool,
}

const PAGES: [&str; 4] = ["/", "/docs", "/pricing", "/signup"];

/// One click.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Click {
    user: String,
    page: String,
    /// The number of the batch it arrived in.
    batch: u64,
}

/// Whether user `k` clicks in batch `i`, and how often: bursts of 3 to 5
/// batches (by user), then as many idle batches.
fn clicks_of(k: u64, i: u64) -> u64 {
    let half = 3 + k % 3;
    if ((i + k) / half).is_multiple_of(2) { 1 + (i + k) % 2 } else { 0 }
}

/// The clicks of batch `i`.
fn clicks(i: u64, users: u64) -> Vec<Click> {
    (0..users)
        .flat_map(|k| {
            (0..clicks_of(k, i)).map(move |n| Click {
                user: format!("user-{k}"),
                page: PAGES[((i * 3 + k + n) % PAGES.len() as u64) as usize].to_string(),
                batch: i,
            })
        })
        .collect()
}

/// The generated clicks as a replayable source: `plan` numbers the batch,
/// `compute` generates that number's clicks.
struct ClickSource {
    users: u64,
    input_batches: Option<u64>,
    next: Mutex<u64>,
    /// The number each batch time got, for the stop condition.
    numbers: Mutex<BTreeMap<Time, u64>>,
}

/// What `plan` logs to `offsets/N`: `{"batch":7}`.
#[derive(Serialize, Deserialize)]
struct Planned {
    batch: u64,
}

impl InputSource<Click> for ClickSource {
    fn is_replayable(&self) -> bool {
        true
    }

    fn plan(&self, _time: Time, _limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let planned = serde_json::to_string(&Planned { batch: *next })?;
        *next += 1;
        Ok(Some(planned))
    }

    fn compute(&self, time: Time, planned: Option<&str>) -> Result<Vec<Vec<Click>>, BoxError> {
        let planned: Planned = serde_json::from_str(planned.ok_or("a replayable source needs its plan")?)?;
        self.numbers.lock().unwrap_or_else(PoisonError::into_inner).insert(time, planned.batch);
        if self.input_batches.is_some_and(|n| planned.batch >= n) {
            return Ok(Vec::new());
        }
        Ok(vec![clicks(planned.batch, self.users)])
    }
}

impl ClickSource {
    fn number_of(&self, time: Time) -> Option<u64> {
        self.numbers.lock().unwrap_or_else(PoisonError::into_inner).get(&time).copied()
    }
}

/// A user's open session: the state `map_with_state` keeps per user.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Session {
    first_batch: u64,
    last_batch: u64,
    clicks: u64,
    pages: BTreeSet<String>,
}

/// A session that timed out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct ClosedSession {
    user: String,
    first_batch: u64,
    last_batch: u64,
    clicks: u64,
    pages: BTreeSet<String>,
}

/// The `map_with_state` function: a click extends the user's session (or
/// opens one); the timeout call closes it and emits it.
fn track(user: &str, click: Option<Click>, state: &mut State<Session>) -> Option<ClosedSession> {
    match click {
        Some(click) => {
            let mut session = state.get().cloned().unwrap_or(Session {
                first_batch: click.batch,
                last_batch: click.batch,
                clicks: 0,
                pages: BTreeSet::new(),
            });
            session.last_batch = click.batch;
            session.clicks += 1;
            session.pages.insert(click.page);
            state.update(session);
            None
        }
        None if state.is_timing_out() => state.get().map(|s| ClosedSession {
            user: user.to_string(),
            first_batch: s.first_batch,
            last_batch: s.last_batch,
            clicks: s.clicks,
            pages: s.pages.clone(),
        }),
        None => None,
    }
}

/// What the pipeline's outputs report.
#[derive(Default)]
struct Shared {
    closed: Mutex<Vec<ClosedSession>>,
    open: AtomicU64,
    all_closed: AtomicBool,
}

fn declare(p: &mut PipelineBuilder, args: &Args, source: &Arc<ClickSource>, shared: &Arc<Shared>) {
    let resume = Arc::clone(source);
    // After a restart the numbering continues after the last logged batch.
    let on_resume: OffsetsHook = Box::new(move |offsets: &str| {
        let planned: Planned = serde_json::from_str(offsets).map_err(|e| e.to_string())?;
        *resume.next.lock().unwrap_or_else(PoisonError::into_inner) = planned.batch + 1;
        Ok(())
    });
    let timeout = Duration::from_millis(args.batch_ms).times(args.timeout_batches);
    let sessions = p
        .replayable_input("clicks", Arc::clone(source), Some(on_resume), None)
        .map(|click: Click| (click.user.clone(), click))
        .map_with_state(|user: &String, click, state: &mut State<Session>| track(user, click, state), Some(timeout))
        .name("sessions");

    let (out, quiet) = (Arc::clone(shared), args.quiet);
    sessions
        .mapped()
        .flat_map(|closed: Option<ClosedSession>| closed)
        .foreach_batch(move |batch, info| {
            for s in batch.iter() {
                if !quiet {
                    let pages: Vec<&str> = s.pages.iter().map(String::as_str).collect();
                    println!(
                        "batch {}: session of {} closed: clicks in batches {}..={}, {} clicks on {}",
                        info.batch_id,
                        s.user,
                        s.first_batch,
                        s.last_batch,
                        s.clicks,
                        pages.join(" ")
                    );
                }
            }
            out.closed.lock().unwrap_or_else(PoisonError::into_inner).extend(batch.iter().cloned());
            Ok(())
        })
        .name("print-closed-sessions");

    let (out, source, input_batches) = (Arc::clone(shared), Arc::clone(source), args.input_batches);
    sessions
        .state_snapshots()
        .foreach_batch(move |batch, info| {
            let open = batch.iter().count() as u64;
            out.open.store(open, Ordering::Relaxed);
            // The clicks ended before this batch and no session is open: all were emitted.
            let quiet_now = match (input_batches, source.number_of(info.time)) {
                (Some(n), Some(number)) => number >= n,
                _ => false,
            };
            if quiet_now && open == 0 {
                out.all_closed.store(true, Ordering::Relaxed);
            }
            Ok(())
        })
        .name("count-open-sessions");
}

/// What a run did.
#[derive(Debug)]
struct Summary {
    closed: Vec<ClosedSession>,
    open: u64,
    batches: u64,
    recovery: String,
    all_closed: bool,
}

/// Runs the example and says what it did.
fn run(args: &Args) -> Result<Summary, Error> {
    let source = Arc::new(ClickSource {
        users: args.users,
        input_batches: args.input_batches,
        next: Mutex::new(0),
        numbers: Mutex::default(),
    });
    let shared = Arc::new(Shared::default());
    let settings = StreamingSettings::new(Duration::from_millis(args.batch_ms));
    let ctx = StreamingContext::get_or_create(&args.checkpoint, settings, |p| {
        declare(p, args, &source, &shared);
        Ok(())
    })?;
    let recovery = ctx.recovery().map(ToString::to_string).unwrap_or_default();
    let done = Arc::clone(&shared);
    let outcome = run_until(ctx, args.seconds, |_| done.all_closed.load(Ordering::Relaxed))?;
    let closed = std::mem::take(&mut *shared.closed.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(Summary {
        closed,
        open: shared.open.load(Ordering::Relaxed),
        batches: outcome.batches,
        recovery,
        all_closed: outcome.done,
    })
}

fn main() -> ExitCode {
    common::init_logging();
    let args = Args::parse();
    match run(&args) {
        Ok(s) => {
            let clicks: u64 = s.closed.iter().map(|c| c.clicks).sum();
            let end = if s.all_closed { "every session timed out" } else { "time is up" };
            println!(
                "{}; {} batches; {} sessions closed ({clicks} clicks), {} still open in {}; stopped: {end}",
                s.recovery,
                s.batches,
                s.closed.len(),
                s.open,
                args.checkpoint.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sessions: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// The sessions the clicks of batches `0..batches` make, worked out from
    /// the timeout rule alone: a click more than `timeout + 1` batches after
    /// the user's previous one starts a new session (idle for longer than
    /// the timeout, the session timed out before it).
    fn expected(users: u64, batches: u64, timeout: u64) -> Vec<ClosedSession> {
        let mut sessions = Vec::new();
        for k in 0..users {
            let mut open: Option<ClosedSession> = None;
            for click in (0..batches).flat_map(|i| clicks(i, users)).filter(|c| c.user == format!("user-{k}")) {
                if let Some(s) = open.take_if(|s| click.batch - s.last_batch > timeout + 1) {
                    sessions.push(s);
                }
                let s = open.get_or_insert_with(|| ClosedSession {
                    user: click.user.clone(),
                    first_batch: click.batch,
                    last_batch: click.batch,
                    clicks: 0,
                    pages: BTreeSet::new(),
                });
                s.last_batch = click.batch;
                s.clicks += 1;
                s.pages.insert(click.page);
            }
            sessions.extend(open);
        }
        sessions.sort();
        sessions
    }

    #[test]
    fn every_burst_of_clicks_is_one_session_emitted_when_it_times_out() {
        common::init_logging();
        let dir = tempfile::tempdir().unwrap();
        let args = Args {
            checkpoint: dir.path().join("checkpoint"),
            seconds: 120,
            users: 4,
            input_batches: Some(24),
            batch_ms: 100,
            timeout_batches: 2,
            quiet: true,
        };
        let mut summary = run(&args).unwrap();
        assert!(summary.all_closed, "the sessions did not all time out within 120 s: {summary:?}");
        assert_eq!(summary.open, 0);
        summary.closed.sort();
        let expected = expected(4, 24, 2);
        // Bursts of 3 to 5 batches over 24 batches: several sessions per user.
        assert!(expected.len() >= 4 * 2, "{expected:?}");
        assert_eq!(summary.closed, expected);
    }
}
