//! `spate checkpoint set-offsets`: the safe form of hand-editing a Spark
//! checkpoint's offsets. It writes a new `offsets/<next>` entry through the
//! log store, under the writer lock, and never changes an existing entry,
//! in a directory or in `s3://bucket/prefix` alike.

use std::path::Path;

use serde_json::Value;
use spate_core::{BatchId, Clock, Duration, SystemClock, Time};
use spate_logstore::{
    Checkpoint, CommitMetadata, LogStoreError, ObjectStoreSettings, OffsetSeq, SourceOffset, Verdict,
};

use crate::error::CliError;
use crate::location::checkpoint_options;
use crate::repair::require_dir;

const ACTION: &str = "cannot set offsets in checkpoint";

/// What to write.
#[derive(Debug)]
pub(crate) struct SetOffsets<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) settings: &'a ObjectStoreSettings,
    pub(crate) source: &'a str,
    pub(crate) json: &'a str,
    pub(crate) commit: bool,
}

/// The entry to write and the id it gets, from the verdict.
fn plan(
    request: &SetOffsets<'_>,
    verdict: Verdict,
    offset: Value,
    now: Time,
) -> Result<(BatchId, OffsetSeq, CommitMetadata), CliError> {
    let (next, base, commit) = match verdict {
        Verdict::Fresh => (BatchId(0), OffsetSeq::default(), CommitMetadata::default()),
        Verdict::Resume { next, last_offsets, last_commit } => (next, last_offsets, last_commit),
        Verdict::Rerun { batch, .. } => {
            return Err(CliError::Refused {
                message: format!(
                    "batch {batch} of checkpoint {} is planned (offsets/{batch}) but not committed; a logged \
                     entry is never changed, because the job re-runs that batch with exactly those offsets. \
                     Run the job until it commits batch {batch}, stop it, then set the offsets again",
                    request.dir.display()
                ),
            });
        }
        Verdict::Inconsistent(inconsistency) => {
            return Err(CliError::checkpoint(ACTION, request.dir, LogStoreError::Inconsistent(inconsistency)));
        }
    };
    let mut entry = base.clone();
    match entry.sources.iter_mut().find(|s| s.name == request.source) {
        Some(source) => source.offset = Some(offset),
        None if base.sources.is_empty() => entry.sources.push(SourceOffset::new(request.source, Some(offset))),
        None => {
            let known: Vec<&str> = base.sources.iter().map(|s| s.name.as_str()).collect();
            return Err(CliError::usage(format!(
                "checkpoint {} has no source named {:?}; its sources are: {}",
                request.dir.display(),
                request.source,
                known.join(", ")
            )));
        }
    }
    entry.batch_timestamp = next_batch_time(&base, now);
    Ok((next, entry, commit))
}

/// A batch time after the last one and not before now, on the same grid
/// (the interval is unknown here, so the whole second is used when the last
/// time is one, else the millisecond).
fn next_batch_time(last: &OffsetSeq, now: Time) -> Time {
    let grid = if last.batch_timestamp.is_multiple_of(Duration::from_secs(1)) {
        Duration::from_secs(1)
    } else {
        Duration::from_millis(1)
    };
    now.floor(grid).max(last.batch_timestamp + grid)
}

/// Runs the command and returns what to print.
pub(crate) fn run(request: &SetOffsets<'_>) -> Result<String, CliError> {
    let offset: Value =
        serde_json::from_str(request.json).map_err(|source| CliError::BadJson { flag: "--json", source })?;
    require_dir(request.dir, request.settings, ACTION)?;
    let fail = |e| CliError::checkpoint(ACTION, request.dir, e);
    let checkpoint = Checkpoint::open_for_write(request.dir, checkpoint_options(request.settings)).map_err(fail)?;
    let verdict = checkpoint.verdict().map_err(fail)?;
    let previous = match &verdict {
        Verdict::Resume { last_offsets, .. } => last_offsets.offset_of(request.source).flatten().cloned(),
        _ => None,
    };
    let (id, entry, commit) = plan(request, verdict, offset.clone(), SystemClock.now())?;
    if !checkpoint.offsets().add(id, &entry).map_err(fail)? {
        return Err(CliError::Refused {
            message: format!(
                "offsets/{id} appeared while writing it: another writer is active in {}",
                request.dir.display()
            ),
        });
    }
    let was = previous.map_or_else(|| "none".to_string(), |v| v.to_string());
    let mut text = format!("Wrote offsets/{id}: source {} at {offset} (was {was}).", request.source);
    if request.commit {
        checkpoint.commits().add(id, &commit).map_err(fail)?;
        text.push_str(&format!(
            "\nWrote commits/{id}: the next run starts batch {} with {} at these offsets; nothing before them is read.",
            id.next().map_or_else(|| "none (it is the largest batch id)".to_string(), |b| b.to_string()),
            request.source
        ));
    } else {
        text.push_str(&format!(
            "\nThe next run re-runs batch {id}, reading {} from its previous offsets up to these.",
            request.source
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ExitCode;
    use serde_json::json;
    use spate_logstore::CheckpointSettings;

    const LOCAL: &ObjectStoreSettings = &ObjectStoreSettings {
        endpoint: None,
        region: None,
        access_key_id: None,
        secret_access_key: None,
        allow_http: None,
    };

    fn request<'a>(dir: &'a Path, json: &'a str, commit: bool) -> SetOffsets<'a> {
        SetOffsets { dir, settings: LOCAL, source: "events", json, commit }
    }

    fn committed_batch(dir: &Path) {
        let ck = Checkpoint::open_for_write(dir, CheckpointSettings::new()).unwrap();
        let seq = OffsetSeq {
            batch_timestamp: Time::from_millis(1_700_000_000_000),
            sources: vec![SourceOffset::new("events", Some(json!({"t": {"0": 10}}))), SourceOffset::new("other", None)],
            ..OffsetSeq::default()
        };
        ck.offsets().add(BatchId(0), &seq).unwrap();
        ck.commits().add(BatchId(0), &CommitMetadata::default()).unwrap();
    }

    #[test]
    fn writes_the_next_entry_keeping_other_sources() {
        let root = tempfile::tempdir().unwrap();
        committed_batch(root.path());
        let text = run(&request(root.path(), r#"{"t":{"0":36}}"#, false)).unwrap();
        assert!(text.contains("offsets/1") && text.contains(r#"was {"t":{"0":10}}"#), "{text}");
        let Verdict::Rerun { batch, offsets, .. } = spate_logstore::inspect(root.path()).unwrap() else {
            panic!("expected a re-run")
        };
        assert_eq!(batch, BatchId(1));
        assert_eq!(offsets.offset_of("events"), Some(Some(&json!({"t": {"0": 36}}))));
        assert_eq!(offsets.offset_of("other"), Some(None));
        assert!(offsets.batch_timestamp > Time::from_millis(1_700_000_000_000));
        // Now batch 1 is pending: a second change is refused, and nothing is written.
        let error = run(&request(root.path(), r#"{"t":{"0":40}}"#, false)).unwrap_err();
        assert_eq!(error.exit_code(), ExitCode::Refused);
        assert!(!root.path().join("offsets/2").exists());
    }

    #[test]
    fn commit_makes_the_offsets_the_start_of_the_next_run() {
        let root = tempfile::tempdir().unwrap();
        committed_batch(root.path());
        run(&request(root.path(), r#"{"t":{"0":5}}"#, true)).unwrap();
        let verdict = spate_logstore::inspect(root.path()).unwrap();
        let Verdict::Resume { next, last_offsets, .. } = verdict else { panic!("expected a resume") };
        assert_eq!(next, BatchId(2));
        assert_eq!(last_offsets.offset_of("events"), Some(Some(&json!({"t": {"0": 5}}))));
    }

    #[test]
    fn bad_input_is_refused_before_any_change() {
        let root = tempfile::tempdir().unwrap();
        committed_batch(root.path());
        assert_eq!(run(&request(root.path(), "{not json", false)).unwrap_err().exit_code(), ExitCode::Usage);
        let unknown = SetOffsets { source: "nope", ..request(root.path(), "1", false) };
        let error = run(&unknown).unwrap_err();
        assert!(error.to_string().contains("events, other"), "{error}");
        assert!(!root.path().join("offsets/1").exists());
        let _writer = Checkpoint::open_for_write(root.path(), CheckpointSettings::new()).unwrap();
        assert_eq!(run(&request(root.path(), "1", false)).unwrap_err().exit_code(), ExitCode::Locked);
    }
}
