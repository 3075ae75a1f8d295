//! What every job command (`spate demo`, `spate run`) shares: refusing an
//! inconsistent checkpoint with the repair command, the recovery line, one
//! progress line a batch, and stopping (Ctrl-C/SIGTERM, `--seconds`,
//! `--until-batch`) through the runtime's stop handle.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use spate_core::sync::lock;
use spate_core::{BatchId, Clock, Duration, SystemClock};
use spate_logstore::{LogStoreError, ObjectStoreSettings, Verdict, file_manager_for, inspect_with};
use spate_runtime::{
    BatchProgress, ProgressListener, RecoveryReport, RuntimeError, StopHandle, StopReport, StreamingContext,
};

use crate::error::CliError;
use crate::signals::{listen, say};

/// How a job is watched and stopped.
#[derive(Clone, Debug)]
pub(crate) struct JobControl {
    /// The checkpoint: a directory or `s3://bucket/prefix`.
    pub(crate) checkpoint: PathBuf,
    /// What the job does, for error messages ("cannot run the demo on checkpoint").
    pub(crate) action: &'static str,
    /// No progress lines.
    pub(crate) quiet: bool,
    /// Stop gracefully after this many seconds.
    pub(crate) seconds: Option<u64>,
    /// Stop gracefully once this batch committed.
    pub(crate) until_batch: Option<u64>,
}

/// Prints to stdout, one line at a time, ignoring a closed stdout.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    out: Mutex<()>,
}

impl Lines {
    pub(crate) fn say(&self, line: &str) {
        let _guard = lock(&self.out);
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
}

/// Prints the progress line of each batch and the recovery line, and stops
/// the context once the batch asked for committed.
struct Progress {
    lines: Arc<Lines>,
    quiet: bool,
    dir: PathBuf,
    rerun: Mutex<Option<BatchId>>,
    until_batch: Option<u64>,
    stop: Mutex<Option<StopHandle>>,
    stopping: AtomicBool,
}

impl Progress {
    fn set_stop_handle(&self, handle: StopHandle) {
        *lock(&self.stop) = Some(handle);
    }
}

impl ProgressListener for Progress {
    fn on_batch_completed(&self, p: &BatchProgress) {
        if !self.quiet {
            self.lines.say(&progress_line(p));
        }
        let mut rerun = lock(&self.rerun);
        if *rerun == Some(p.batch_id) {
            *rerun = None;
            self.lines.say(&format!(
                "resumed from checkpoint {}: re-ran batch {} with its logged offsets, continuing at batch {}",
                self.dir.display(),
                p.batch_id,
                p.batch_id.next().map_or_else(|| "none (it is the largest batch id)".to_string(), |b| b.to_string())
            ));
        }
        let reached = self.until_batch.is_some_and(|until| p.batch_id.0 >= until);
        if reached
            && !self.stopping.swap(true, Ordering::AcqRel)
            && let Some(handle) = lock(&self.stop).as_ref()
        {
            handle.stop_gracefully();
        }
    }

    fn on_recovery(&self, report: &RecoveryReport) {
        *lock(&self.rerun) = report.rerun_batch;
        self.lines.say(&recovery_line(report));
    }
}

/// The line printed when the context opens its checkpoint.
fn recovery_line(report: &RecoveryReport) -> String {
    let dir = report.checkpoint_dir.display();
    let mut line = match (report.rerun_batch, report.last_committed) {
        (Some(rerun), _) => {
            format!("resuming from checkpoint {dir}: batch {rerun} was logged but not committed; re-running it first")
        }
        (None, Some(last)) => {
            format!(
                "resumed from checkpoint {dir}: batch {last} was committed, continuing at batch {}",
                report.resumed_at
            )
        }
        (None, None) => format!("new checkpoint {dir}: starting at batch {}", report.resumed_at),
    };
    if !report.pending_batch_times.is_empty() {
        line.push_str(&format!(" ({} batch times missed while down run first)", report.pending_batch_times.len()));
    }
    if !report.restored_operators.is_empty() || !report.replayed_for_state.is_empty() {
        line.push_str(&format!(
            "; state restored in {} ms, {} batches recomputed in {} ms",
            report.restore_ms,
            report.replayed_for_state.len(),
            report.replay_ms
        ));
    }
    if !report.unrecoverable_blocks.is_empty() {
        line.push_str(&format!(
            "; warning: {} received blocks could not be read back",
            report.unrecoverable_blocks.len()
        ));
    }
    line
}

/// One batch: id, input records, rate, processing time, scheduling delay.
pub(crate) fn progress_line(p: &BatchProgress) -> String {
    format!(
        "batch {:>6} | {:>7} records | {:>9.1} rec/s | processing {:>4} ms | scheduling delay {:>5} ms{}",
        p.batch_id.0,
        p.input_records,
        p.input_rate,
        p.processing_time_ms,
        p.scheduling_delay_ms,
        if p.recovered { " | re-run after restart" } else { "" }
    )
}

/// Refuses an inconsistent checkpoint (a directory or `s3://bucket/prefix`)
/// with the log store's own message (the files and the repair command)
/// before the runtime takes the lock.
pub(crate) fn refuse_inconsistent(
    dir: &Path,
    settings: &ObjectStoreSettings,
    action: &'static str,
) -> Result<(), CliError> {
    // A location that cannot be reached is for the runtime to report.
    let Ok(files) = file_manager_for(dir, settings) else { return Ok(()) };
    if !files.exists(dir).unwrap_or(false) {
        return Ok(());
    }
    match inspect_with(files.as_ref(), dir) {
        Ok(Verdict::Inconsistent(inconsistency)) => {
            Err(CliError::checkpoint(action, dir, LogStoreError::Inconsistent(inconsistency)))
        }
        // Anything else is for the runtime to judge and report.
        _ => Ok(()),
    }
}

/// A runtime error while doing `action` on the checkpoint `dir`.
pub(crate) fn runtime_error(action: &'static str, dir: &Path, source: RuntimeError) -> CliError {
    CliError::Runtime { action, dir: dir.to_path_buf(), source }
}

/// Starts `ctx`, prints its progress, stops it on a signal, after
/// `--seconds` or once `--until-batch` committed, and waits for it.
pub(crate) fn drive(
    mut ctx: StreamingContext,
    control: &JobControl,
    lines: Arc<Lines>,
) -> Result<StopReport, CliError> {
    let progress = Arc::new(Progress {
        lines,
        quiet: control.quiet,
        dir: control.checkpoint.clone(),
        rerun: Mutex::new(None),
        until_batch: control.until_batch,
        stop: Mutex::new(None),
        stopping: AtomicBool::new(false),
    });
    ctx.add_progress_listener(progress.clone());
    let handle = ctx.stop_handle();
    progress.set_stop_handle(handle.clone());
    let on_signal = handle.clone();
    let _signals = listen(move || on_signal.stop_gracefully())?;
    if let Some(seconds) = control.seconds {
        let timer = handle.clone();
        std::thread::Builder::new()
            .name("spate-job-timer".into())
            .spawn(move || {
                let clock = SystemClock;
                clock.sleep_until(clock.now() + Duration::from_secs(seconds));
                // A graceful stop, as a first signal would ask for; it does
                // not count as a signal, so a Ctrl-C after it is still the first.
                say(&format!("--seconds {seconds} elapsed: stopping gracefully"));
                timer.stop_gracefully();
            })
            .map_err(|e| CliError::io("start the timer of", "--seconds", e))?;
    }
    let fail = |e| runtime_error(control.action, &control.checkpoint, e);
    ctx.start().map_err(fail)?;
    // On stderr, one line each, so a person (or a test) can open them.
    if let Some(addr) = ctx.metrics_addr() {
        say(&format!("metrics: http://{addr}/metrics"));
    }
    if let Some(addr) = ctx.ui_addr() {
        say(&format!("web page: http://{addr}/"));
    }
    let report = ctx.await_termination().map_err(fail)?;
    if !report.graceful {
        return Err(CliError::Interrupted);
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_core::Time;
    use spate_runtime::RestoredOperator;

    fn report() -> RecoveryReport {
        RecoveryReport {
            checkpoint_dir: PathBuf::from("/ck"),
            writer_epoch: 3,
            took_over_from: None,
            last_committed: Some(BatchId(6)),
            rerun_batch: None,
            pending_batch_times: Vec::new(),
            resumed_at: BatchId(7),
            restored_operators: Vec::new(),
            new_operators: Vec::new(),
            dropped_operators: Vec::new(),
            replayed_for_state: Vec::new(),
            unrecoverable_blocks: Vec::new(),
            restore_ms: 0,
            replay_ms: 0,
        }
    }

    #[test]
    fn the_recovery_line_says_where_the_job_continues() {
        assert_eq!(
            recovery_line(&report()),
            "resumed from checkpoint /ck: batch 6 was committed, continuing at batch 7"
        );
        let rerun = RecoveryReport { rerun_batch: Some(BatchId(7)), resumed_at: BatchId(8), ..report() };
        assert!(recovery_line(&rerun).contains("batch 7 was logged but not committed; re-running it first"));
        let fresh = RecoveryReport { last_committed: None, resumed_at: BatchId(0), ..report() };
        assert_eq!(recovery_line(&fresh), "new checkpoint /ck: starting at batch 0");
        let missed = RecoveryReport { pending_batch_times: vec![Time::from_millis(1000); 3], ..report() };
        assert!(recovery_line(&missed).ends_with("(3 batch times missed while down run first)"));
        let restored = RecoveryReport {
            restored_operators: vec![RestoredOperator {
                name: "window-counts".into(),
                snapshot_batch: BatchId(4),
                changes_applied: 1,
            }],
            replayed_for_state: vec![BatchId(5), BatchId(6)],
            restore_ms: 812,
            replay_ms: 1450,
            ..report()
        };
        assert!(
            recovery_line(&restored).ends_with("; state restored in 812 ms, 2 batches recomputed in 1450 ms"),
            "{}",
            recovery_line(&restored)
        );
    }

    #[test]
    fn the_progress_line_has_id_records_rate_processing_and_delay() {
        let progress = BatchProgress {
            late_records: 0,
            batch_id: BatchId(12),
            batch_time: Time::from_millis(12_000),
            recovered: true,
            input_records: 1000,
            input_rate: 1000.0,
            processing_rate: 5000.0,
            scheduling_delay_ms: 4,
            processing_time_ms: 200,
            phases: spate_runtime::PhaseTimes::default(),
            state_bytes: 0,
            state_checkpointed: false,
            state_incremental: false,
            rate_limit: None,
            receivers: Vec::new(),
        };
        assert_eq!(
            progress_line(&progress),
            "batch     12 |    1000 records |    1000.0 rec/s | processing  200 ms | scheduling delay     4 ms | \
             re-run after restart"
        );
    }
}
