//! The demo job's batch loop on the log store: plan a batch and log its
//! offsets, compute the window, write it through the exactly-once sink,
//! commit. A restart follows the log store's verdict: an uncommitted batch
//! runs again with exactly its logged positions, so nothing is lost and the
//! sink sees nothing twice.

use std::io::Write;
use std::sync::Arc;

use serde_json::{Value, json};
use spate_core::{BatchId, Clock, Duration, Time};
use spate_logstore::{Checkpoint, CheckpointOptions, CommitMetadata, OffsetSeq, SourceOffset, Verdict};

use super::generator::{count_words, top_words};
use super::sink::FileSink;
use crate::error::CliError;
use crate::signals::StopFlag;

/// The demo's source name in `offsets/N`.
pub(crate) const SOURCE: &str = "words";
/// The pinned setting holding the generator's seed.
const SEED_KEY: &str = "spate.demo.seed";
/// Batches kept in the logs: more than a window, so a window's start is always there.
const RETAIN_BATCHES: u64 = 100;

/// How the demo runs.
#[derive(Clone, Debug)]
pub(crate) struct DemoConfig {
    pub(crate) seed: u64,
    pub(crate) records_per_batch: u64,
    pub(crate) batch: Duration,
    pub(crate) window_batches: u64,
    pub(crate) slide_batches: u64,
    pub(crate) top: usize,
    pub(crate) until_batch: Option<u64>,
    pub(crate) deadline: Option<Time>,
    pub(crate) quiet: bool,
}

/// Where the checkpoint put this run.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Start {
    /// A new checkpoint.
    Fresh,
    /// Every logged batch committed; plan `next`.
    Resume { next: BatchId, last_time: Time, last_end: u64 },
    /// Batch `batch` was logged but not committed: run it again first.
    Rerun { batch: BatchId, time: Time, start: u64, end: u64 },
}

/// The demo job on one checkpoint directory, holding its writer lock.
#[derive(Debug)]
pub(crate) struct Demo {
    checkpoint: Checkpoint,
    sink: FileSink,
    config: DemoConfig,
    clock: Arc<dyn Clock>,
    conf: std::collections::BTreeMap<String, String>,
}

/// How a run ended.
#[derive(Debug, PartialEq)]
pub(crate) struct Finished {
    /// The last batch committed in this run, if any.
    pub(crate) last_committed: Option<BatchId>,
    /// Why it stopped.
    pub(crate) reason: &'static str,
}

fn position_of(seq: &OffsetSeq) -> Option<u64> {
    seq.offset_of(SOURCE).flatten().and_then(|v| v["position"].as_u64())
}

impl Demo {
    /// Opens the checkpoint for writing (failing if another writer holds it
    /// or it is inconsistent) and finds where to start.
    pub(crate) fn open(
        dir: &std::path::Path,
        sink: FileSink,
        mut config: DemoConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<(Demo, Start, Vec<String>), CliError> {
        let fail = |e| CliError::checkpoint("cannot run the demo on checkpoint", dir, e);
        let options = CheckpointOptions::new().retain_batches(RETAIN_BATCHES).clock(clock.clone());
        let checkpoint = Checkpoint::open_for_write(dir, options).map_err(fail)?;
        let verdict = checkpoint.verdict().map_err(fail)?.into_consistent().map_err(fail)?;
        let mut notes = Vec::new();
        let logged = match &verdict {
            Verdict::Resume { last_offsets, .. } => Some(last_offsets),
            Verdict::Rerun { offsets, .. } => Some(offsets),
            _ => None,
        };
        if let Some(pinned) = logged.and_then(|seq| seq.conf.get(SEED_KEY)).and_then(|s| s.parse::<u64>().ok())
            && pinned != config.seed
        {
            notes.push(format!("the checkpoint pins seed {pinned}; --seed {} is ignored", config.seed));
            config.seed = pinned;
        }
        let conf = [(SEED_KEY.to_string(), config.seed.to_string())].into();
        let demo = Demo { checkpoint, sink, config, clock, conf };
        let start = demo.start_of(verdict)?;
        Ok((demo, start, notes))
    }

    fn start_of(&self, verdict: Verdict) -> Result<Start, CliError> {
        Ok(match verdict {
            Verdict::Fresh | Verdict::Inconsistent(_) => Start::Fresh,
            Verdict::Resume { next, last_offsets, .. } => Start::Resume {
                next,
                last_time: last_offsets.batch_timestamp,
                last_end: self.position(&last_offsets, next.prev().unwrap_or_default())?,
            },
            Verdict::Rerun { batch, offsets, .. } => Start::Rerun {
                batch,
                time: offsets.batch_timestamp,
                start: self.end_of(batch.prev())?,
                end: self.position(&offsets, batch)?,
            },
        })
    }

    fn position(&self, seq: &OffsetSeq, id: BatchId) -> Result<u64, CliError> {
        position_of(seq).ok_or_else(|| CliError::Refused {
            message: format!(
                "offsets/{id} in {} has no position for source {SOURCE:?}; it was not written by the demo \
                 (set it with `spate checkpoint set-offsets {} --source {SOURCE} --json '{{\"position\":N}}'`)",
                self.checkpoint.dir().display(),
                self.checkpoint.dir().display()
            ),
        })
    }

    /// The generator position after batch `id` (0 before the first batch).
    fn end_of(&self, id: Option<BatchId>) -> Result<u64, CliError> {
        let Some(id) = id else { return Ok(0) };
        let fail = |e| CliError::checkpoint("cannot read the offsets of checkpoint", self.checkpoint.dir(), e);
        match self.checkpoint.offsets().get(id).map_err(fail)? {
            Some(seq) => self.position(&seq, id),
            // Purged: only possible for batches far behind any window, which start at 0 then.
            None => Ok(0),
        }
    }

    /// Logs batch `id`'s offsets (before any work) and runs it.
    pub(crate) fn plan_and_run(
        &self,
        id: BatchId,
        time: Time,
        start: u64,
        out: &mut dyn Write,
    ) -> Result<u64, CliError> {
        let end = start + self.config.records_per_batch;
        let seq = OffsetSeq {
            batch_timestamp: time,
            conf: self.conf.clone(),
            sources: vec![SourceOffset::new(SOURCE, Some(json!({ "position": end })))],
            ..OffsetSeq::default()
        };
        let fail = |e| CliError::checkpoint("cannot log the offsets of checkpoint", self.checkpoint.dir(), e);
        if !self.checkpoint.offsets().add(id, &seq).map_err(fail)? {
            return Err(CliError::Refused {
                message: format!("offsets/{id} appeared while this run was planning it: another writer is active"),
            });
        }
        self.run_batch(id, time, start, end, false, out)?;
        Ok(end)
    }

    /// Runs batch `id` over positions `start..end`: window output, then commit.
    pub(crate) fn run_batch(
        &self,
        id: BatchId,
        time: Time,
        start: u64,
        end: u64,
        recovered: bool,
        out: &mut dyn Write,
    ) -> Result<(), CliError> {
        let began = self.clock.now();
        let window = self.window_output(id, time, end)?;
        if let Some(line) = &window {
            self.sink
                .write_batch(id.0, std::slice::from_ref(line))
                .map_err(|e| CliError::Job { batch: id.0, source: Box::new(e) })?;
        }
        let fail = |e| CliError::checkpoint("cannot commit to checkpoint", self.checkpoint.dir(), e);
        self.checkpoint.commits().add(id, &CommitMetadata::default()).map_err(fail)?;
        if id.0.is_multiple_of(10) {
            self.checkpoint.purge_old_batches().map_err(fail)?;
        }
        if !self.config.quiet {
            let records = end.saturating_sub(start);
            let progress = ProgressLine { id, records, interval: self.config.batch, began, time, recovered };
            let _ = writeln!(out, "{}", progress.render(self.clock.now()));
            if let Some(line) = &window {
                let _ = writeln!(out, "  {}", render_window(line));
            }
        }
        Ok(())
    }

    /// The window result after batch `id`, on slide boundaries only.
    fn window_output(&self, id: BatchId, time: Time, end: u64) -> Result<Option<Value>, CliError> {
        if !(id.0 + 1).is_multiple_of(self.config.slide_batches) {
            return Ok(None);
        }
        let first_batch = (id.0 + 1).saturating_sub(self.config.window_batches);
        let window_start = self.end_of(BatchId(first_batch).prev())?;
        let counts = count_words(self.config.seed, window_start, end);
        let top: Vec<Value> =
            top_words(&counts, self.config.top).into_iter().map(|(w, c)| json!({"word": w, "count": c})).collect();
        Ok(Some(json!({
            "batch": id.0,
            "batchTimeMs": time.as_millis(),
            "windowBatches": [first_batch, id.0],
            "windowPositions": [window_start, end],
            "records": end.saturating_sub(window_start),
            "top": top,
        })))
    }

    /// Runs batches until a stop is requested, the deadline passes or `until_batch` committed.
    pub(crate) fn run(&self, start: Start, stop: &StopFlag, out: &mut dyn Write) -> Result<Finished, CliError> {
        let batch = self.config.batch;
        let first_tick = |last: Option<Time>| {
            let next_tick = self.clock.now().floor(batch) + batch;
            last.map_or(next_tick, |t| (t + batch).max(next_tick))
        };
        let (mut next, mut time, mut position, mut last_committed) = match start {
            Start::Fresh => {
                let _ = writeln!(out, "new checkpoint {}: starting at batch 0", self.checkpoint.dir().display());
                (BatchId(0), first_tick(None), 0, None)
            }
            Start::Resume { next, last_time, last_end } => {
                let _ = writeln!(
                    out,
                    "resumed from checkpoint {}: batch {} was committed, continuing at batch {next}",
                    self.checkpoint.dir().display(),
                    next.prev().unwrap_or_default()
                );
                (next, first_tick(Some(last_time)), last_end, next.prev())
            }
            Start::Rerun { batch: id, time: logged, start, end } => {
                self.run_batch(id, logged, start, end, true, out)?;
                let _ = writeln!(
                    out,
                    "resumed from checkpoint {}: re-ran batch {id} with its logged offsets (positions {start}..{end}), \
                     continuing at batch {}",
                    self.checkpoint.dir().display(),
                    id.next()
                );
                (id.next(), first_tick(Some(logged)), end, Some(id))
            }
        };
        loop {
            if let Some(reason) = self.stop_reason(stop, last_committed) {
                return Ok(Finished { last_committed, reason });
            }
            let wake = self.config.deadline.map_or(time, |d| d.min(time));
            if !stop.wait_until(self.clock.as_ref(), wake) || self.clock.now() < time {
                continue;
            }
            position = self.plan_and_run(next, time, position, out)?;
            last_committed = Some(next);
            next = next.next();
            time = time + batch;
        }
    }

    fn stop_reason(&self, stop: &StopFlag, last: Option<BatchId>) -> Option<&'static str> {
        if stop.is_requested() {
            Some("stopped by a signal")
        } else if self.config.until_batch.is_some_and(|until| last.is_some_and(|l| l.0 >= until)) {
            Some("reached the last batch asked for")
        } else if self.config.deadline.is_some_and(|d| self.clock.now() >= d) {
            Some("ran for the time asked for")
        } else {
            None
        }
    }

    /// The checkpoint directory.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.checkpoint.dir()
    }
}

/// One batch's progress line.
struct ProgressLine {
    id: BatchId,
    records: u64,
    interval: Duration,
    began: Time,
    time: Time,
    recovered: bool,
}

impl ProgressLine {
    fn render(&self, now: Time) -> String {
        let rate = self.records as f64 / self.interval.as_secs_f64().max(0.001);
        format!(
            "batch {:>6} | {:>7} records | {:>9.1} rec/s | processing {:>4} ms | scheduling delay {:>5} ms{}",
            self.id,
            self.records,
            rate,
            now.since(self.began).as_millis(),
            self.began.since(self.time).as_millis(),
            if self.recovered { " | re-run after restart" } else { "" }
        )
    }
}

fn render_window(line: &Value) -> String {
    let words: Vec<String> = line["top"]
        .as_array()
        .map(|top| top.iter().map(|e| format!("{} {}", e["word"].as_str().unwrap_or("?"), e["count"])).collect())
        .unwrap_or_default();
    format!(
        "window of batches {}..={} ({} records): {}",
        line["windowBatches"][0],
        line["windowBatches"][1],
        line["records"],
        words.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::sink::OUTPUT_FILE;
    use spate_core::ManualClock;

    fn config() -> DemoConfig {
        DemoConfig {
            seed: 9,
            records_per_batch: 50,
            batch: Duration::from_secs(1),
            window_batches: 4,
            slide_batches: 2,
            top: 3,
            until_batch: None,
            deadline: None,
            quiet: false,
        }
    }

    fn open(root: &std::path::Path, clock: &ManualClock) -> Result<(Demo, Start, Vec<String>), CliError> {
        let sink = FileSink::new(&root.join("out"));
        Demo::open(&root.join("ck"), sink, config(), Arc::new(clock.clone()))
    }

    fn output(root: &std::path::Path) -> Vec<Value> {
        std::fs::read_to_string(root.join("out").join(OUTPUT_FILE))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn windows_cover_the_last_batches_and_a_crash_re_runs_exactly_the_logged_batch() {
        let root = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(1_000_000));
        let mut out = Vec::new();
        let (demo, start, _) = open(root.path(), &clock).unwrap();
        assert_eq!(start, Start::Fresh);
        let mut position = 0;
        for id in 0..6 {
            position = demo
                .plan_and_run(BatchId(id), Time::from_millis(1_000_000 + 1000 * id as i64), position, &mut out)
                .unwrap();
        }
        // A crash after logging batch 6's offsets and writing its output, before its commit.
        let seq = OffsetSeq {
            batch_timestamp: Time::from_millis(1_006_000),
            conf: demo.conf.clone(),
            sources: vec![SourceOffset::new(SOURCE, Some(json!({"position": 350})))],
            ..OffsetSeq::default()
        };
        demo.checkpoint.offsets().add(BatchId(6), &seq).unwrap();
        drop(demo);

        let (demo, start, _) = open(root.path(), &clock).unwrap();
        assert_eq!(start, Start::Rerun { batch: BatchId(6), time: Time::from_millis(1_006_000), start: 300, end: 350 });
        demo.run_batch(BatchId(6), Time::from_millis(1_006_000), 300, 350, true, &mut out).unwrap();
        demo.run_batch(BatchId(7), Time::from_millis(1_007_000), 350, 400, false, &mut out).unwrap();

        let windows = output(root.path());
        let batches: Vec<u64> = windows.iter().map(|w| w["batch"].as_u64().unwrap()).collect();
        assert_eq!(batches, [1, 3, 5, 7]);
        assert_eq!(windows[0]["windowPositions"], json!([0, 100]));
        assert_eq!(windows[2]["windowPositions"], json!([100, 300]));
        assert_eq!(windows[3]["windowPositions"], json!([200, 400]));
        let top = top_words(&count_words(9, 200, 400), 3);
        assert_eq!(windows[3]["top"][0]["word"], top[0].0);
        assert_eq!(windows[3]["top"][0]["count"], top[0].1);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("re-run after restart"), "{text}");
    }

    #[test]
    fn a_second_writer_and_a_changed_seed_are_handled() {
        let root = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Time::from_millis(1_000_000));
        let (demo, _, _) = open(root.path(), &clock).unwrap();
        let error = open(root.path(), &clock).unwrap_err();
        assert_eq!(error.exit_code(), crate::error::ExitCode::Locked);
        demo.plan_and_run(BatchId(0), Time::from_millis(1_000_000), 0, &mut Vec::new()).unwrap();
        drop(demo);
        let sink = FileSink::new(&root.path().join("out"));
        let other_seed = DemoConfig { seed: 10, ..config() };
        let (demo, start, notes) = Demo::open(&root.path().join("ck"), sink, other_seed, Arc::new(clock)).unwrap();
        assert_eq!(demo.config.seed, 9);
        assert!(notes[0].contains("pins seed 9"), "{notes:?}");
        assert!(matches!(start, Start::Resume { next: BatchId(1), last_end: 50, .. }));
    }
}
