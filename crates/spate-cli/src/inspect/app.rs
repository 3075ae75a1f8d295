//! The inspection of an application's location (`spate run --app`: a
//! `tasks/` directory holding one checkpoint per task,
//! `<topic>-<partition>`, and no `metadata` of its own), shown as the whole
//! application: a row per task (last committed batch, last offsets batch,
//! verdict, lock and its holder) and the members, told apart by the pid and
//! host their lock files record, with the tasks each holds or last held.
//! See [`Application::to_json`] for its JSON.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use spate_core::BatchId;
use spate_logstore::{
    Checkpoint, LockHolder, LockStatus, METADATA_FILE, ObjectStoreSettings, OffsetSeq, Verdict, file_manager_for,
};
use spate_runtime::read_progress;

use super::checkpoint::{committed_offsets, lock_json, verdict_json};
use crate::error::CliError;
use crate::location::checkpoint_options;

/// The directory of an application's task checkpoints under its location
/// (spate-app's layout: `<location>/tasks/<topic>-<partition>/`).
pub(crate) const TASKS_DIR: &str = "tasks";

/// Whether `dir` is an application's location: it holds `tasks/` and no
/// checkpoint `metadata` of its own. A location that cannot be listed is
/// not taken for one: the checkpoint's own reading reports the error.
pub(crate) fn is_application(dir: &Path, settings: &ObjectStoreSettings) -> bool {
    let Ok(files) = file_manager_for(dir, settings) else { return false };
    let Ok(names) = files.list(dir) else { return false };
    names.iter().any(|n| n == TASKS_DIR) && !names.iter().any(|n| n == METADATA_FILE)
}

/// A task's topic and partition from its directory's name, `<topic>-<partition>`.
fn task_topic_partition(name: &str) -> Option<(&str, u32)> {
    let (topic, partition) = name.rsplit_once('-')?;
    if topic.is_empty() {
        return None;
    }
    Some((topic, partition.parse().ok()?))
}

/// What one task's checkpoint says.
#[derive(Debug)]
pub(crate) struct TaskState {
    pub(crate) verdict: Verdict,
    /// The highest id in `commits/`.
    pub(crate) last_commit: Option<BatchId>,
    /// The highest id in `offsets/`.
    pub(crate) last_offsets: Option<BatchId>,
    /// The offsets of the last committed batch (when the logs are consistent).
    pub(crate) committed: Option<(BatchId, OffsetSeq)>,
    pub(crate) lock: LockStatus,
    /// Records its event-time operators set aside as late, over the batches
    /// its progress files still hold.
    pub(crate) late_records: u64,
}

/// One task of an application.
#[derive(Debug)]
pub(crate) struct TaskRow {
    /// `<topic>-<partition>`, the name of its directory.
    pub(crate) name: String,
    pub(crate) dir: PathBuf,
    /// Its state, or why it could not be read.
    pub(crate) state: Result<TaskState, String>,
}

impl TaskRow {
    /// The holder its lock file records (alive or not) and whether it holds the lock now.
    fn owner(&self) -> Option<(&LockHolder, bool)> {
        match &self.state.as_ref().ok()?.lock {
            LockStatus::Held(Some(holder)) => Some((holder, true)),
            LockStatus::Free(Some(holder)) => Some((holder, false)),
            LockStatus::Never | LockStatus::Held(None) | LockStatus::Free(None) => None,
        }
    }
}

/// A member of an application as the task locks show it: one process
/// (pid and host) and the tasks whose lock file names it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MemberRow {
    pub(crate) host: String,
    pub(crate) pid: u32,
    /// The tasks it holds now, with its epoch in each.
    pub(crate) holds: Vec<(String, u64)>,
    /// The tasks it held last and let go (or died holding), with its epoch in each.
    pub(crate) last_held: Vec<(String, u64)>,
}

/// What `inspect` found at an application's location.
#[derive(Debug)]
pub(crate) struct Application {
    pub(crate) dir: PathBuf,
    /// By topic, then partition.
    pub(crate) tasks: Vec<TaskRow>,
    /// By host, then pid.
    pub(crate) members: Vec<MemberRow>,
}

/// Reads every task checkpoint under `<dir>/tasks/`; changes nothing.
pub(crate) fn inspect_application(dir: &Path, settings: &ObjectStoreSettings) -> Result<Application, CliError> {
    let tasks_dir = dir.join(TASKS_DIR);
    let fail = |e| CliError::checkpoint("cannot inspect application", dir, e);
    let files = file_manager_for(dir, settings).map_err(fail)?;
    let mut names = files.list(&tasks_dir).map_err(fail)?;
    names.sort_by(|a, b| match (task_topic_partition(a), task_topic_partition(b)) {
        (Some(a), Some(b)) => a.cmp(&b),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.cmp(b),
    });
    let tasks: Vec<TaskRow> = names
        .into_iter()
        .map(|name| {
            let task_dir = tasks_dir.join(&name);
            let state = task_state(&task_dir, settings).map_err(|e| e.to_string());
            TaskRow { name, dir: task_dir, state }
        })
        .collect();
    let members = members_of(&tasks);
    Ok(Application { dir: dir.to_path_buf(), tasks, members })
}

fn task_state(dir: &Path, settings: &ObjectStoreSettings) -> spate_logstore::Result<TaskState> {
    let checkpoint = Checkpoint::open_read_only(dir, checkpoint_options(settings))?;
    let verdict = checkpoint.verdict()?;
    // Progress is advisory: a task whose progress files do not read shows no late records.
    let late_records = file_manager_for(dir, settings)
        .ok()
        .and_then(|files| read_progress(files.as_ref(), dir).ok())
        .map_or(0, |history| history.records.iter().map(|r| r.progress.late_records).sum());
    Ok(TaskState {
        late_records,
        last_commit: checkpoint.commits().latest_id()?,
        last_offsets: checkpoint.offsets().latest_id()?,
        committed: committed_offsets(&checkpoint, &verdict),
        lock: checkpoint.lock_status(),
        verdict,
    })
}

/// The members the task locks name, each with the tasks it holds or last held.
fn members_of(tasks: &[TaskRow]) -> Vec<MemberRow> {
    let mut members: std::collections::BTreeMap<(String, u32), MemberRow> = std::collections::BTreeMap::new();
    for task in tasks {
        let Some((holder, held)) = task.owner() else { continue };
        let member = members.entry((holder.host.clone(), holder.pid)).or_insert_with(|| MemberRow {
            host: holder.host.clone(),
            pid: holder.pid,
            holds: Vec::new(),
            last_held: Vec::new(),
        });
        let list = if held { &mut member.holds } else { &mut member.last_held };
        list.push((task.name.clone(), holder.epoch));
    }
    members.into_values().collect()
}

/// `pid@host`, as a member is named.
fn pid_at_host(holder: &LockHolder) -> String {
    format!("{}@{}", holder.pid, holder.host)
}

/// The `until` of every offset range (`{"from":…,"until":…}`) in `value`:
/// where the next batch of a Kafka source starts reading.
fn range_ends(value: &Value, out: &mut Vec<u64>) {
    match value {
        Value::Object(map) => match map.get("until").and_then(Value::as_u64) {
            Some(until) if map.contains_key("from") => out.push(until),
            _ => map.values().for_each(|inner| range_ends(inner, out)),
        },
        Value::Array(items) => items.iter().for_each(|inner| range_ends(inner, out)),
        _ => {}
    }
}

fn short_verdict(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Fresh => "fresh".to_string(),
        Verdict::Resume { next, .. } => format!("resume at {next}"),
        Verdict::Rerun { batch, .. } => format!("re-run {batch}"),
        Verdict::Inconsistent(_) => "INCONSISTENT".to_string(),
    }
}

fn short_lock(lock: &LockStatus) -> String {
    match lock {
        LockStatus::Never => "never taken".to_string(),
        LockStatus::Held(Some(holder)) => format!("held by {} (epoch {})", pid_at_host(holder), holder.epoch),
        LockStatus::Held(None) => "held (lock file unreadable)".to_string(),
        LockStatus::Free(Some(last)) => format!("free, last {} (epoch {})", pid_at_host(last), last.epoch),
        LockStatus::Free(None) => "free".to_string(),
    }
}

fn optional_id(id: Option<BatchId>) -> String {
    id.map_or_else(|| "-".to_string(), |id| id.to_string())
}

fn task_names(tasks: &[(String, u64)]) -> String {
    tasks.iter().map(|(name, epoch)| format!("{name} (epoch {epoch})")).collect::<Vec<_>>().join(", ")
}

/// Lines of cells, each column as wide as its widest cell, two spaces apart.
fn table(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> =
                row.iter().enumerate().map(|(c, cell)| format!("{cell:<w$}", w = widths[c])).collect();
            format!("  {}", cells.join("  ").trim_end())
        })
        .collect()
}

impl Application {
    /// The text `inspect` prints for an application.
    pub(crate) fn to_text(&self) -> String {
        let mut lines = vec![format!(
            "Application {} ({} task(s) under {TASKS_DIR}/, each a checkpoint of its own)",
            self.dir.display(),
            self.tasks.len()
        )];
        lines.push("Tasks:".to_string());
        let mut rows = vec![
            ["TASK", "COMMITTED", "OFFSETS", "NEXT OFFSET", "LATE", "VERDICT", "LOCK"].map(str::to_string).to_vec(),
        ];
        let mut unreadable = Vec::new();
        for task in &self.tasks {
            let state = match &task.state {
                Ok(state) => state,
                Err(error) => {
                    unreadable.push(format!("  {}: unreadable: {error}", task.name));
                    continue;
                }
            };
            let mut ends = Vec::new();
            if let Some((_, seq)) = &state.committed {
                seq.sources.iter().filter_map(|s| s.offset.as_ref()).for_each(|v| range_ends(v, &mut ends));
            }
            let next = if ends.is_empty() {
                "-".to_string()
            } else {
                ends.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
            };
            rows.push(vec![
                task.name.clone(),
                optional_id(state.last_commit),
                optional_id(state.last_offsets),
                next,
                state.late_records.to_string(),
                short_verdict(&state.verdict),
                short_lock(&state.lock),
            ]);
        }
        if rows.len() > 1 {
            lines.extend(table(&rows));
        }
        lines.extend(unreadable);
        if self.tasks.is_empty() {
            lines.push("  none yet".to_string());
        }
        lines.push("Members (by the pid and host of their task locks):".to_string());
        if self.members.is_empty() {
            lines.push("  none recorded".to_string());
        }
        for member in &self.members {
            let holds = if member.holds.is_empty() { "none".to_string() } else { task_names(&member.holds) };
            let mut line = format!("  {}@{}: holds {holds}", member.pid, member.host);
            if !member.last_held.is_empty() {
                line.push_str(&format!("; last held {}", task_names(&member.last_held)));
            }
            lines.push(line);
        }
        if let Some(problem) =
            self.tasks.iter().find(|t| t.state.as_ref().map_or(true, |s| matches!(s.verdict, Verdict::Inconsistent(_))))
        {
            lines.push(format!(
                "Task {} needs attention: spate checkpoint inspect {}",
                problem.name,
                problem.dir.display()
            ));
        } else {
            lines.push(format!(
                "One task in full: spate checkpoint inspect {}",
                self.dir.join(TASKS_DIR).join("<task>").display()
            ));
        }
        lines.join("\n")
    }

    /// The JSON `inspect --json` prints for an application:
    ///
    /// ```text
    /// {"application": {
    ///   "dir": "<location>",
    ///   "tasks": [{"task": "lines-0", "topic": "lines", "partition": 0, "dir": "<location>/tasks/lines-0",
    ///              "lastCommit": 12, "lastOffsets": 13, "verdict": {"kind": "rerun", "batch": 13, …},
    ///              "committedBatch": {"id": 12, "sources": [{"name": "kafka", "offset": …}]},
    ///              "lock": {"held": true, "holder": {"pid", "host", "sinceMs", "epoch"}, "lastWriter": null},
    ///              "owner": {"pid", "host", "epoch", "holds": true}, "error": null}, …],
    ///   "members": [{"pid": 4242, "host": "host-a", "holding": true,
    ///                "holds": [{"task": "lines-0", "epoch": 3}], "lastHeld": [{"task": "lines-1", "epoch": 2}]}, …]}}
    /// ```
    ///
    /// A task that cannot be read has `"error"` set and its other fields null;
    /// `owner` is whoever its lock file names, holding it now or not. A
    /// member is `holding` while it holds at least one task's lock: a live
    /// process on a local disk, an unexpired lease in S3 (a member that died
    /// is shown holding until its leases run out).
    pub(crate) fn to_json(&self) -> Value {
        let tasks: Vec<Value> = self
            .tasks
            .iter()
            .map(|task| {
                let (topic, partition) = task_topic_partition(&task.name).unzip();
                let mut row = json!({
                    "task": task.name,
                    "topic": topic,
                    "partition": partition,
                    "dir": task.dir.display().to_string(),
                    "lastCommit": null,
                    "lastOffsets": null,
                    "verdict": null,
                    "committedBatch": null,
                    "lock": null,
                    "owner": task.owner().map(|(holder, held)| json!({
                        "pid": holder.pid, "host": holder.host, "epoch": holder.epoch, "holds": held,
                    })),
                    "error": task.state.as_ref().err(),
                });
                if let Ok(state) = &task.state {
                    row["lastCommit"] = json!(state.last_commit.map(|id| id.0));
                    row["lastOffsets"] = json!(state.last_offsets.map(|id| id.0));
                    row["verdict"] = verdict_json(&state.verdict);
                    row["committedBatch"] = json!(state.committed.as_ref().map(|(id, seq)| json!({
                        "id": id.0,
                        "sources": seq.sources.iter().map(|s| json!({"name": s.name, "offset": s.offset})).collect::<Vec<_>>(),
                    })));
                    row["lock"] = lock_json(&state.lock);
                    row["lateRecords"] = json!(state.late_records);
                }
                row
            })
            .collect();
        let listed = |tasks: &[(String, u64)]| {
            tasks.iter().map(|(task, epoch)| json!({"task": task, "epoch": epoch})).collect::<Vec<_>>()
        };
        let members: Vec<Value> = self
            .members
            .iter()
            .map(|m| {
                json!({
                    "pid": m.pid,
                    "host": m.host,
                    "holding": !m.holds.is_empty(),
                    "holds": listed(&m.holds),
                    "lastHeld": listed(&m.last_held),
                })
            })
            .collect();
        json!({"application": {"dir": self.dir.display().to_string(), "tasks": tasks, "members": members}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::run;
    use spate_core::Time;
    use spate_logstore::{CheckpointSettings, CommitMetadata, SourceOffset};

    fn local() -> ObjectStoreSettings {
        ObjectStoreSettings::default()
    }

    fn task_offsets(id: u64) -> OffsetSeq {
        let range = json!({"lines": {"0": {"from": id * 100, "until": (id + 1) * 100}}});
        OffsetSeq {
            batch_timestamp: Time::from_millis(1_700_000_000_000 + 1000 * id as i64),
            sources: vec![SourceOffset::new("kafka", Some(range))],
            ..OffsetSeq::default()
        }
    }

    /// A task checkpoint under `<root>/tasks/<name>` with `planned` offsets
    /// entries and `committed` commits, still open for writing.
    fn task(root: &Path, name: &str, planned: u64, committed: &[u64]) -> Checkpoint {
        let writer = Checkpoint::open_for_write(root.join(TASKS_DIR).join(name), CheckpointSettings::new()).unwrap();
        for id in 0..planned {
            writer.offsets().add(BatchId(id), &task_offsets(id)).unwrap();
        }
        for &id in committed {
            writer.commits().add(BatchId(id), &CommitMetadata::default()).unwrap();
        }
        writer
    }

    /// Makes the lock file of a released task name another process, as
    /// another member's would.
    fn last_held_by(root: &Path, name: &str, pid: u32, host: &str, epoch: u64) {
        let path = root.join(TASKS_DIR).join(name).join(spate_logstore::LOCK_FILE);
        let holder = LockHolder { pid, host: host.to_string(), since: Time::from_millis(1_700_000_000_000), epoch };
        std::fs::write(&path, spate_logstore::encode_lock_file(&path, &holder).unwrap()).unwrap();
    }

    #[test]
    fn an_application_is_shown_as_its_tasks_and_members() {
        let root = tempfile::tempdir().unwrap();
        let app = root.path().join("app");
        // lines-0: held by this process, batch 2 planned and not committed.
        let _held = task(&app, "lines-0", 3, &[0, 1]);
        // lines-10 and lines-2: last held by another member, which is gone; lines-2 has a commit ahead.
        drop(task(&app, "lines-10", 2, &[0, 1]));
        last_held_by(&app, "lines-10", 4242, "host-b", 3);
        drop(task(&app, "lines-2", 1, &[0, 1]));
        last_held_by(&app, "lines-2", 4242, "host-b", 2);
        // app-words-0: opened by this process, nothing logged, released.
        drop(task(&app, "app-words-0", 0, &[]));

        assert!(is_application(&app, &local()));
        assert!(!is_application(&app.join(TASKS_DIR).join("lines-0"), &local()));
        assert!(!is_application(&root.path().join("missing"), &local()));

        let application = inspect_application(&app, &local()).unwrap();
        let names: Vec<&str> = application.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["app-words-0", "lines-0", "lines-2", "lines-10"], "by topic, then partition as a number");
        let lines0 = application.tasks[1].state.as_ref().unwrap();
        assert_eq!((lines0.last_commit, lines0.last_offsets), (Some(BatchId(1)), Some(BatchId(2))));
        assert!(matches!(lines0.verdict, Verdict::Rerun { batch: BatchId(2), .. }), "{:?}", lines0.verdict);
        let pid = std::process::id();
        let LockStatus::Held(Some(me)) = &lines0.lock else { panic!("lines-0 is held: {:?}", lines0.lock) };
        assert_eq!(me.pid, pid);
        let host = me.host.clone();

        assert_eq!(application.members.len(), 2, "{:?}", application.members);
        let other = application.members.iter().find(|m| m.pid == 4242).unwrap();
        assert_eq!(other.host, "host-b");
        assert!(other.holds.is_empty());
        assert_eq!(other.last_held, [("lines-2".to_string(), 2), ("lines-10".to_string(), 3)]);
        let this = application.members.iter().find(|m| m.pid == pid).unwrap();
        assert_eq!(this.holds.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(), ["lines-0"]);
        assert_eq!(this.last_held.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(), ["app-words-0"]);

        let text = application.to_text();
        let row = |name: &str| {
            text.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("{text}"))
        };
        let cells = |name: &str| row(name).split_whitespace().map(str::to_string).collect::<Vec<_>>();
        // TASK, COMMITTED, OFFSETS, NEXT OFFSET (the committed batch's end), LATE, VERDICT, LOCK.
        assert_eq!(cells("lines-0")[..7], ["lines-0", "1", "2", "200", "0", "re-run", "2"], "{text}");
        assert!(row("lines-0").ends_with(&format!("held by {pid}@{host} (epoch 1)")), "{text}");
        assert_eq!(cells("lines-10")[..7], ["lines-10", "1", "1", "200", "0", "resume", "at"], "{text}");
        assert!(row("lines-10").ends_with("free, last 4242@host-b (epoch 3)"), "{text}");
        assert_eq!(cells("lines-2")[..6], ["lines-2", "1", "0", "-", "0", "INCONSISTENT"], "{text}");
        assert_eq!(cells("app-words-0")[..6], ["app-words-0", "-", "-", "-", "0", "fresh"], "{text}");
        assert!(text.starts_with(&format!("Application {} (4 task(s) under tasks/", app.display())), "{text}");
        assert!(text.contains("  4242@host-b: holds none; last held lines-2 (epoch 2), lines-10 (epoch 3)"), "{text}");
        assert!(
            text.contains(&format!("  {pid}@{host}: holds lines-0 (epoch 1); last held app-words-0 (epoch 1)")),
            "{text}"
        );
        let lines2 = app.join("tasks/lines-2");
        assert!(
            text.contains(&format!("Task lines-2 needs attention: spate checkpoint inspect {}", lines2.display())),
            "{text}"
        );

        let json = run(&app, &local(), true).unwrap();
        let json: Value = serde_json::from_str(&json).unwrap();
        let tasks = json["application"]["tasks"].as_array().unwrap();
        assert_eq!(tasks.len(), 4);
        assert_eq!(tasks[1]["task"], "lines-0");
        assert_eq!((tasks[1]["topic"].as_str(), tasks[1]["partition"].as_u64()), (Some("lines"), Some(0)));
        assert_eq!(tasks[1]["lastCommit"], 1);
        assert_eq!(tasks[1]["lastOffsets"], 2);
        assert_eq!(tasks[1]["verdict"]["kind"], "rerun");
        assert_eq!(tasks[1]["committedBatch"]["id"], 1);
        assert_eq!(tasks[1]["committedBatch"]["sources"][0]["offset"]["lines"]["0"]["until"], 200);
        assert_eq!(tasks[1]["lock"]["held"], true);
        assert_eq!(tasks[1]["owner"], json!({"pid": pid, "host": host, "epoch": 1, "holds": true}));
        assert_eq!(tasks[2]["verdict"]["kind"], "inconsistent");
        assert_eq!(tasks[2]["committedBatch"], Value::Null);
        assert_eq!(tasks[3]["owner"], json!({"pid": 4242, "host": "host-b", "epoch": 3, "holds": false}));
        let members = json["application"]["members"].as_array().unwrap();
        let other = members.iter().find(|m| m["pid"] == 4242).unwrap();
        assert_eq!(other["holding"], false);
        assert_eq!(other["lastHeld"], json!([{"task": "lines-2", "epoch": 2}, {"task": "lines-10", "epoch": 3}]));
        // The text form too goes through `run`.
        assert_eq!(run(&app, &local(), false).unwrap(), text);
    }

    #[test]
    fn an_application_without_tasks_yet_and_a_checkpoint_holding_tasks() {
        let root = tempfile::tempdir().unwrap();
        let app = root.path().join("app");
        std::fs::create_dir_all(app.join(TASKS_DIR)).unwrap();
        let text = run(&app, &local(), false).unwrap();
        assert!(text.contains("(0 task(s) under tasks/") && text.contains("  none yet"), "{text}");
        assert!(text.contains("Members (by the pid and host of their task locks):\n  none recorded"), "{text}");

        // A checkpoint of its own (it has `metadata`) stays one, whatever else it holds.
        drop(Checkpoint::open_for_write(&app, CheckpointSettings::new()).unwrap());
        assert!(!is_application(&app, &local()));
        assert!(run(&app, &local(), false).unwrap().starts_with(&format!("Checkpoint {} (spate)", app.display())));
    }
}
