//! `spate checkpoint repair LOCATION [--apply]`: show the repair plan of an
//! inconsistent checkpoint (a directory or `s3://bucket/prefix`) and, when
//! asked, carry it out under the writer lock. Files are moved to
//! `_quarantine/` (in S3: copied there, then deleted), never just deleted;
//! a `graph` manifest that names operator state taken after the last kept
//! commit is rewritten to name older state, its original kept there too.

use std::path::Path;

use spate_logstore::{Checkpoint, LogStoreError, ObjectStoreSettings, file_manager_for};

use crate::error::CliError;
use crate::inspect::{TASKS_DIR, is_application};
use crate::location::checkpoint_options;

const ACTION: &str = "cannot repair checkpoint";

/// The checkpoint must exist: opening for write would otherwise create it.
/// An application's location is refused too: it is not a checkpoint but
/// holds one per task, and writing to it would make it look like one.
pub(crate) fn require_dir(dir: &Path, settings: &ObjectStoreSettings, action: &'static str) -> Result<(), CliError> {
    if is_application(dir, settings) {
        return Err(CliError::usage(format!(
            "{action} {}: it is the location of an application, which holds one checkpoint per task under \
             {TASKS_DIR}/; name the task's checkpoint instead, e.g. {} (`spate checkpoint inspect {}` lists them)",
            dir.display(),
            example_task(dir, settings),
            dir.display()
        )));
    }
    let fail = |e| CliError::checkpoint(action, dir, e);
    if file_manager_for(dir, settings).map_err(fail)?.exists(dir).map_err(fail)? {
        return Ok(());
    }
    let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such checkpoint directory");
    Err(fail(LogStoreError::Io { op: "open", path: dir.to_path_buf(), source: missing }))
}

/// The path of the application's first task, or a pattern when it has none.
fn example_task(dir: &Path, settings: &ObjectStoreSettings) -> String {
    let tasks = dir.join(TASKS_DIR);
    let first = file_manager_for(dir, settings).ok().and_then(|files| files.list(&tasks).ok()).and_then(|mut names| {
        names.sort();
        names.into_iter().next()
    });
    tasks.join(first.as_deref().unwrap_or("<topic>-<partition>")).display().to_string()
}

/// Runs the command and returns what to print.
pub(crate) fn run(dir: &Path, settings: &ObjectStoreSettings, apply: bool) -> Result<String, CliError> {
    require_dir(dir, settings, ACTION)?;
    let fail = |e| CliError::checkpoint(ACTION, dir, e);
    let checkpoint = if apply {
        Checkpoint::open_for_write(dir, checkpoint_options(settings))
    } else {
        Checkpoint::open_read_only(dir, checkpoint_options(settings))
    }
    .map_err(fail)?;
    let Some(plan) = checkpoint.repair_plan().map_err(fail)? else {
        let verdict = checkpoint.verdict().map_err(fail)?;
        return Ok(format!("Checkpoint {} is consistent ({verdict}); nothing to repair.", dir.display()));
    };
    if !apply {
        return Ok(format!("{plan}\nNothing was changed."));
    }
    checkpoint.apply_repair(&plan).map_err(fail)?;
    let verdict = checkpoint.verdict().map_err(fail)?;
    let rewritten = if plan.state.is_some() { ", graph rewritten (its original kept there too)" } else { "" };
    Ok(format!(
        "{plan}\nApplied: {} file(s) moved to {}{rewritten} (see REPAIR.txt there).\nThe checkpoint is now: {verdict}.",
        plan.actions.len(),
        dir.join(&plan.quarantine).display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ExitCode;
    use spate_core::BatchId;
    use spate_logstore::{CheckpointSettings, CommitMetadata, OffsetSeq, Verdict};

    fn local() -> ObjectStoreSettings {
        ObjectStoreSettings::default()
    }

    fn commit_ahead(dir: &Path) {
        let ck = Checkpoint::open_for_write(dir, CheckpointSettings::new()).unwrap();
        for id in 0..3 {
            ck.offsets().add(BatchId(id), &OffsetSeq::default()).unwrap();
            ck.commits().add(BatchId(id), &CommitMetadata::default()).unwrap();
        }
        ck.commits().add(BatchId(3), &CommitMetadata::default()).unwrap();
    }

    #[test]
    fn plan_changes_nothing_and_apply_quarantines() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        commit_ahead(&dir);
        let plan = run(&dir, &local(), false).unwrap();
        assert!(plan.contains("commits/3") && plan.contains("Nothing was changed"), "{plan}");
        assert!(dir.join("commits/3").exists());

        let applied = run(&dir, &local(), true).unwrap();
        assert!(applied.contains("Applied: 1 file(s)"), "{applied}");
        assert!(!dir.join("commits/3").exists());
        assert!(matches!(spate_logstore::inspect(&dir).unwrap(), Verdict::Resume { next: BatchId(3), .. }));
        assert!(run(&dir, &local(), false).unwrap().contains("nothing to repair"));
    }

    #[test]
    fn an_application_location_is_refused_naming_a_task_and_left_as_it_was() {
        let root = tempfile::tempdir().unwrap();
        let app = root.path().join("app");
        commit_ahead(&app.join(TASKS_DIR).join("lines-0"));
        let task = app.join("tasks/lines-0");
        let settings = local();
        let set = |commit| crate::set_offsets::SetOffsets {
            dir: &app,
            settings: &settings,
            source: "kafka",
            json: "1",
            commit,
        };
        let errors = [
            run(&app, &local(), false).unwrap_err(),
            run(&app, &local(), true).unwrap_err(),
            crate::set_offsets::run(&set(false)).unwrap_err(),
            crate::set_offsets::run(&set(true)).unwrap_err(),
        ];
        for error in errors {
            assert_eq!(error.exit_code(), ExitCode::Usage, "{error}");
            let text = error.to_string();
            assert!(text.contains("location of an application"), "{text}");
            assert!(text.contains(&format!("e.g. {}", task.display())), "{text}");
        }
        let mut names: Vec<String> =
            std::fs::read_dir(&app).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["tasks"], "nothing is written at the application's location");
        // The task itself is repaired as any checkpoint.
        assert!(run(&task, &local(), true).unwrap().contains("Applied: 1 file(s)"));
    }

    #[test]
    fn apply_is_refused_while_a_writer_runs() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ck");
        commit_ahead(&dir);
        let _writer = Checkpoint::open_for_write(&dir, CheckpointSettings::new()).unwrap();
        let error = run(&dir, &local(), true).unwrap_err();
        assert_eq!(error.exit_code(), ExitCode::Locked);
        assert!(dir.join("commits/3").exists());
        assert!(run(&root.path().join("missing"), &local(), true).is_err());
        assert!(!root.path().join("missing").exists());
    }
}
