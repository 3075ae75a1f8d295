//! The inspection of one checkpoint (spate's or Spark Structured
//! Streaming's, in a directory or in `s3://bucket/prefix`), without changing
//! it: the logs, the verdict, the last offsets, the lock, the sizes.
//! Everything is read through the checkpoint's file manager, so both kinds
//! of location show the same.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use spate_core::{BatchId, Time};
use spate_logstore::{
    COMMITS_DIR, Checkpoint, CheckpointFileManager, LockHolder, LockStatus, MAX_METADATA_BYTES, METADATA_FILE,
    OFFSETS_DIR, ObjectStoreSettings, OffsetSeq, Verdict, parse_batch_file_name,
};
use spate_runtime::{ProgressHistory, read_progress};

use crate::error::CliError;
use crate::location::checkpoint_options;

/// The parts of a checkpoint whose sizes are reported, in this order.
const PARTS: [&str; 6] = [OFFSETS_DIR, COMMITS_DIR, "state", "receivedData", "receivedBlockMetadata", "progress"];
/// Spark keeps per-source metadata here; its presence marks a Spark checkpoint.
const SPARK_SOURCES_DIR: &str = "sources";

/// Who wrote the checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Written by spate (`metadata` is a `v1` log entry).
    Spate,
    /// Written by Spark Structured Streaming (`metadata` is bare JSON, sources named by position).
    Spark,
}

/// File count and bytes of one part of the checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PartSize {
    pub(crate) name: String,
    pub(crate) present: bool,
    pub(crate) files: u64,
    pub(crate) bytes: u64,
    /// The batch ids named by the part's top-level files (for `offsets/` and `commits/`), ascending.
    pub(crate) batch_ids: Vec<BatchId>,
}

/// What `inspect` found.
#[derive(Debug)]
pub(crate) struct Inspection {
    pub(crate) dir: PathBuf,
    pub(crate) format: Format,
    pub(crate) id: Option<String>,
    pub(crate) created_at: Option<Time>,
    pub(crate) offsets_ids: Vec<BatchId>,
    pub(crate) commits_ids: Vec<BatchId>,
    pub(crate) verdict: Verdict,
    pub(crate) last_batch: Option<(BatchId, OffsetSeq)>,
    pub(crate) last_batch_error: Option<String>,
    /// The offsets of the last committed batch: where a new run of the query starts reading.
    pub(crate) committed: Option<(BatchId, OffsetSeq)>,
    /// The writer lock as seen from outside.
    pub(crate) lock: LockStatus,
    pub(crate) parts: Vec<PartSize>,
    /// The progress files read back (stale writers' lines skipped), or why they could not be.
    pub(crate) progress: Result<ProgressHistory, String>,
}

/// Reads everything `inspect` shows; changes nothing.
pub(crate) fn inspect(dir: &Path, settings: &ObjectStoreSettings) -> Result<Inspection, CliError> {
    let fail = |e| CliError::checkpoint("cannot inspect checkpoint", dir, e);
    let checkpoint = Checkpoint::open_read_only(dir, checkpoint_options(settings)).map_err(fail)?;
    let files = checkpoint.files().as_ref();
    let verdict = checkpoint.verdict().map_err(fail)?;
    let (last_batch, last_batch_error) = match last_offsets(&checkpoint, &verdict) {
        Ok(last) => (last, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let committed = committed_offsets(&checkpoint, &verdict);
    // One listing gives both the sizes and the ids of the two logs.
    let mut part_names: Vec<&str> = PARTS.to_vec();
    let format = detect_format(files, dir);
    if format == Format::Spark {
        part_names.push(SPARK_SOURCES_DIR);
    }
    let parts: Vec<PartSize> = part_names.into_iter().map(|name| part_size(files, dir, name)).collect();
    let ids_of = |name: &str| parts.iter().find(|p| p.name == name).map(|p| p.batch_ids.clone()).unwrap_or_default();
    let (offsets_ids, commits_ids) = (ids_of(OFFSETS_DIR), ids_of(COMMITS_DIR));
    Ok(Inspection {
        dir: dir.to_path_buf(),
        format,
        id: checkpoint.metadata().map(|m| m.id.clone()),
        created_at: checkpoint.metadata().map(|m| m.created_at).filter(|t| *t != Time::ZERO),
        offsets_ids,
        commits_ids,
        verdict,
        last_batch,
        last_batch_error,
        committed,
        lock: checkpoint.lock_status(),
        parts,
        progress: read_progress(files, dir).map_err(|e| e.to_string()),
    })
}

/// The newest offsets entry: from the verdict when consistent, else read on its own.
fn last_offsets(checkpoint: &Checkpoint, verdict: &Verdict) -> spate_logstore::Result<Option<(BatchId, OffsetSeq)>> {
    match verdict {
        Verdict::Resume { next, last_offsets, .. } => Ok(next.prev().map(|id| (id, last_offsets.clone()))),
        Verdict::Rerun { batch, offsets, .. } => Ok(Some((*batch, offsets.clone()))),
        _ => checkpoint.offsets().latest(),
    }
}

/// The offsets of the last committed batch (`None`: nothing committed, or
/// the directory is inconsistent and must be repaired first).
pub(super) fn committed_offsets(checkpoint: &Checkpoint, verdict: &Verdict) -> Option<(BatchId, OffsetSeq)> {
    match verdict {
        Verdict::Resume { next, last_offsets, .. } => next.prev().map(|id| (id, last_offsets.clone())),
        Verdict::Rerun { batch, .. } => {
            let id = batch.prev()?;
            checkpoint.offsets().get(id).ok().flatten().map(|seq| (id, seq))
        }
        _ => None,
    }
}

fn detect_format(files: &dyn CheckpointFileManager, dir: &Path) -> Format {
    // Bounded: a damaged or hostile `metadata` is not read into memory whole.
    let metadata_is_bare_json = files
        .read(&dir.join(METADATA_FILE), MAX_METADATA_BYTES)
        .ok()
        .flatten()
        .is_some_and(|bytes| bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{'));
    let has_sources = || files.exists(&dir.join(SPARK_SOURCES_DIR)).unwrap_or(false);
    if metadata_is_bare_json || has_sources() { Format::Spark } else { Format::Spate }
}

/// The files and bytes under `<dir>/<name>`. A part that cannot be listed is
/// shown absent: the verdict, read before, reports what matters.
fn part_size(files: &dyn CheckpointFileManager, dir: &Path, name: &str) -> PartSize {
    let path = dir.join(name);
    let listed = files.list_files_recursive(&path).unwrap_or_default();
    // An object store has no empty directories: a part is there when something is in it.
    let present = !listed.is_empty() || files.exists(&path).unwrap_or(false);
    let mut size = PartSize { name: name.to_string(), present, ..PartSize::default() };
    for (relative, len) in listed {
        size.files += 1;
        size.bytes += len;
        let top_level = relative.components().count() == 1;
        if top_level && let Some(id) = relative.to_str().and_then(parse_batch_file_name) {
            size.batch_ids.push(id);
        }
    }
    size.batch_ids.sort_unstable();
    size
}

/// Bytes in a unit a person reads at a glance.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{bytes} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

fn id_range(ids: &[BatchId]) -> String {
    match (ids.first(), ids.last()) {
        (Some(first), Some(last)) => format!("last id {last} ({} entries, {first}..={last})", ids.len()),
        _ => "none".to_string(),
    }
}

fn offset_text(offset: Option<&Value>) -> String {
    offset.map_or_else(|| "- (no offsets yet)".to_string(), Value::to_string)
}

impl Inspection {
    /// The text `inspect` prints.
    pub(crate) fn to_text(&self) -> String {
        let mut lines = vec![format!(
            "Checkpoint {} ({})",
            self.dir.display(),
            match self.format {
                Format::Spate => "spate",
                Format::Spark => "Spark Structured Streaming; sources are named by position: 0, 1, …",
            }
        )];
        let created = self.created_at.map(|t| format!(", created {}", t.to_iso8601())).unwrap_or_default();
        lines.push(format!("Query id: {}{created}", self.id.as_deref().unwrap_or("(unknown)")));
        lines.push(format!("Offsets: {}", id_range(&self.offsets_ids)));
        lines.push(format!("Commits: {}", id_range(&self.commits_ids)));
        lines.push(format!("Verdict: {}", self.verdict));
        lines.extend(self.last_batch_lines());
        if self.format == Format::Spark {
            lines.extend(self.migration_lines());
        }
        lines.push(format!("Lock: {}", self.lock_text()));
        lines.push(format!("Progress: {}", self.progress_text()));
        lines.push("Sizes:".to_string());
        for part in &self.parts {
            let shown = if part.present {
                format!("{:>6} files {:>11}", part.files, human_bytes(part.bytes))
            } else {
                "(absent)".to_string()
            };
            lines.push(format!("  {:<24}{shown}", format!("{}/", part.name)));
        }
        lines.join("\n")
    }

    fn last_batch_lines(&self) -> Vec<String> {
        if let Some(error) = &self.last_batch_error {
            return vec![format!("Last batch: unreadable: {error}")];
        }
        let Some((id, seq)) = &self.last_batch else { return vec!["Last batch: none".to_string()] };
        let mut lines = vec![format!(
            "Last batch {id}: batch time {} ({} ms), watermark {} ms, {} source(s)",
            seq.batch_timestamp.to_iso8601(),
            seq.batch_timestamp.as_millis(),
            seq.batch_watermark.as_millis(),
            seq.sources.len()
        )];
        lines.extend(seq.sources.iter().map(|s| format!("  source {}: {}", s.name, offset_text(s.offset.as_ref()))));
        lines
    }

    /// How to continue a Spark query in spate: from the last committed batch's offsets.
    fn migration_lines(&self) -> Vec<String> {
        let Some((id, seq)) = &self.committed else {
            return vec![
                "To continue in spate: no batch was committed; start the sources at their initial positions."
                    .to_string(),
            ];
        };
        let mut lines = vec![format!(
            "To continue in spate without losing or repeating input, start each source at the offsets of the \
             last committed batch {id}{}:",
            match self.verdict {
                Verdict::Rerun { batch, .. } =>
                    format!(" (batch {batch} was planned but not committed: it is read again)"),
                _ => String::new(),
            }
        )];
        lines.extend(seq.sources.iter().map(|s| format!("  source {}: {}", s.name, offset_text(s.offset.as_ref()))));
        lines
    }

    /// The last batch the progress files report, by the newest writer.
    fn progress_text(&self) -> String {
        let history = match &self.progress {
            Ok(history) => history,
            Err(error) => return format!("unreadable: {error}"),
        };
        let mut text = match history.records.last() {
            Some(last) => format!(
                "last reported batch {} ({} records, processing {} ms) by writer epoch {}",
                last.progress.batch_id, last.progress.input_records, last.progress.processing_time_ms, last.epoch
            ),
            None => "none".to_string(),
        };
        if history.stale_lines > 0 {
            text.push_str(&format!("; {} line(s) of writers that had lost the lock ignored", history.stale_lines));
        }
        if history.unreadable_lines > 0 {
            text.push_str(&format!("; {} unreadable line(s) ignored", history.unreadable_lines));
        }
        text
    }

    fn lock_text(&self) -> String {
        match &self.lock {
            LockStatus::Never => "none (never opened by a spate writer)".to_string(),
            LockStatus::Held(Some(holder)) => format!("held by {holder}"),
            LockStatus::Held(None) => "held by a live process whose lock file cannot be read".to_string(),
            LockStatus::Free(Some(last)) => format!("none (last writer was {last}; not running)"),
            LockStatus::Free(None) => "none".to_string(),
        }
    }

    /// The JSON `inspect --json` prints.
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "dir": self.dir.display().to_string(),
            "format": match self.format { Format::Spate => "spate", Format::Spark => "spark" },
            "id": self.id,
            "createdAtMs": self.created_at.map(Time::as_millis),
            "offsets": ids_json(&self.offsets_ids),
            "commits": ids_json(&self.commits_ids),
            "verdict": verdict_json(&self.verdict),
            "lastBatch": self.last_batch.as_ref().map(|(id, seq)| json!({
                "id": id.0,
                "batchTimestampMs": seq.batch_timestamp.as_millis(),
                "batchWatermarkMs": seq.batch_watermark.as_millis(),
                "sources": seq.sources.iter().map(|s| json!({"name": s.name, "offset": s.offset})).collect::<Vec<_>>(),
            })),
            "lastBatchError": self.last_batch_error,
            "committedBatch": self.committed.as_ref().map(|(id, seq)| json!({
                "id": id.0,
                "sources": seq.sources.iter().map(|s| json!({"name": s.name, "offset": s.offset})).collect::<Vec<_>>(),
            })),
            "lock": lock_json(&self.lock),
            "progress": progress_json(&self.progress),
            "parts": self.parts.iter().map(|p| (p.name.clone(), json!({
                "present": p.present, "files": p.files, "bytes": p.bytes,
            }))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

fn progress_json(progress: &Result<ProgressHistory, String>) -> Value {
    match progress {
        Ok(history) => json!({
            "records": history.records.len(),
            "lastBatch": history.records.last().map(|r| r.progress.batch_id.0),
            "lastEpoch": history.records.last().map(|r| r.epoch),
            "staleLines": history.stale_lines,
            "unreadableLines": history.unreadable_lines,
        }),
        Err(error) => json!({"error": error}),
    }
}

fn ids_json(ids: &[BatchId]) -> Value {
    json!({"first": ids.first().map(|i| i.0), "last": ids.last().map(|i| i.0), "count": ids.len()})
}

pub(super) fn verdict_json(verdict: &Verdict) -> Value {
    match verdict {
        Verdict::Fresh => json!({"kind": "fresh", "text": verdict.to_string()}),
        Verdict::Resume { next, .. } => json!({"kind": "resume", "next": next.0, "text": verdict.to_string()}),
        Verdict::Rerun { batch, .. } => json!({"kind": "rerun", "batch": batch.0, "text": verdict.to_string()}),
        Verdict::Inconsistent(inconsistency) => json!({
            "kind": "inconsistent",
            "problem": inconsistency.kind.to_string(),
            "files": inconsistency.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            "repairCommand": inconsistency.repair_command(),
            "text": verdict.to_string(),
        }),
    }
}

fn holder_json(holder: &LockHolder) -> Value {
    json!({"pid": holder.pid, "host": holder.host, "sinceMs": holder.since.as_millis(), "epoch": holder.epoch})
}

pub(super) fn lock_json(lock: &LockStatus) -> Value {
    match lock {
        LockStatus::Never => json!({"held": false, "holder": null, "lastWriter": null}),
        LockStatus::Held(holder) => {
            json!({"held": true, "holder": holder.as_ref().map(holder_json), "lastWriter": null})
        }
        LockStatus::Free(last) => json!({"held": false, "holder": null, "lastWriter": last.as_ref().map(holder_json)}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spate_logstore::{CheckpointSettings, CommitMetadata, SourceOffset};

    fn local() -> ObjectStoreSettings {
        ObjectStoreSettings::default()
    }

    #[test]
    fn sizes_are_human() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 20), "5.0 MiB");
    }

    #[test]
    fn a_spate_checkpoint_is_described_with_its_lock_holder() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        let writer = Checkpoint::open_for_write(&dir, CheckpointSettings::new()).unwrap();
        let seq = OffsetSeq {
            batch_timestamp: Time::from_millis(1_700_000_000_000),
            sources: vec![SourceOffset::new("words", Some(json!({"words": 120})))],
            ..OffsetSeq::default()
        };
        writer.offsets().add(BatchId(0), &seq).unwrap();
        writer.commits().add(BatchId(0), &CommitMetadata::default()).unwrap();
        writer.offsets().add(BatchId(1), &seq).unwrap();
        let pid = std::process::id();

        let inspection = inspect(&dir, &local()).unwrap();
        assert_eq!(inspection.format, Format::Spate);
        assert!(matches!(&inspection.lock, LockStatus::Held(Some(h)) if h.pid == pid));
        let text = inspection.to_text();
        assert!(text.contains("Verdict: re-run batch 1"), "{text}");
        assert!(text.contains(r#"source words: {"words":120}"#), "{text}");
        assert!(text.contains(&format!("held by pid {pid}")), "{text}");
        let json = inspection.to_json();
        assert_eq!(json["verdict"]["kind"], "rerun");
        assert_eq!(json["offsets"]["last"], 1);
        assert_eq!(json["parts"]["offsets"]["files"], 2);
        assert_eq!(json["parts"]["state"]["present"], false);

        drop(writer);
        let inspection = inspect(&dir, &local()).unwrap();
        assert!(matches!(&inspection.lock, LockStatus::Free(Some(h)) if h.pid == pid), "{:?}", inspection.lock);
        assert!(inspection.to_text().contains("not running"));
    }

    fn progress_line(epoch: u64, batch: u64) -> String {
        let progress = spate_runtime::BatchProgress {
            late_records: 0,
            batch_id: BatchId(batch),
            batch_time: Time::from_millis(1000 * batch as i64),
            recovered: false,
            input_records: 10,
            input_rate: 10.0,
            processing_rate: 100.0,
            scheduling_delay_ms: 0,
            processing_time_ms: 7,
            phases: spate_runtime::PhaseTimes::default(),
            state_bytes: 0,
            state_checkpointed: false,
            state_incremental: false,
            rate_limit: None,
            receivers: Vec::new(),
        };
        let mut value = serde_json::to_value(&progress).unwrap();
        value["epoch"] = json!(epoch);
        value.to_string()
    }

    #[test]
    fn progress_lines_of_a_writer_that_lost_the_lock_are_ignored() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        drop(Checkpoint::open_for_write(&dir, CheckpointSettings::new()).unwrap());
        std::fs::create_dir(dir.join("progress")).unwrap();
        // Epoch 2 took over after batch 0; epoch 1 wrote one more line after that.
        let lines = [progress_line(1, 0), progress_line(2, 1), progress_line(1, 5)].join("\n");
        std::fs::write(dir.join("progress/progress-000000.jsonl"), lines + "\n").unwrap();
        let inspection = inspect(&dir, &local()).unwrap();
        let json = inspection.to_json();
        assert_eq!(json["progress"]["lastBatch"], 1, "{json}");
        assert_eq!(json["progress"]["lastEpoch"], 2, "{json}");
        assert_eq!(json["progress"]["staleLines"], 1, "{json}");
        let text = inspection.to_text();
        assert!(
            text.contains("Progress: last reported batch 1 (10 records, processing 7 ms) by writer epoch 2"),
            "{text}"
        );
        assert!(text.contains("1 line(s) of writers that had lost the lock ignored"), "{text}");
    }
}
