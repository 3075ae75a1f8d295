//! Watching a member: one `/metrics` for the process, each task's batch
//! figures labelled with its `task`, `stage` and `partition`, and a page
//! of the member's tasks (`/`, with `/api/status`), kept from the member's
//! own events. The tasks serve nothing themselves: they move between
//! members, while the member's addresses stay.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use spate_core::sync::lock;
use spate_runtime::{ProcessServer, ProcessStatus, StreamingSettings};

use crate::error::AppError;
use crate::member::MemberEvent;
use crate::topology::TaskId;

/// `settings` of the task `id`: its batch figures carry the task's labels.
pub(crate) fn labelled(settings: StreamingSettings, id: &TaskId) -> StreamingSettings {
    settings
        .with_metric_label("task", id.to_string())
        .with_metric_label("stage", id.stage.clone())
        .with_metric_label("partition", id.partition.to_string())
}

/// One row of the page: a task as the member last heard of it.
#[derive(Clone, Debug, Default, Serialize)]
struct TaskRow {
    task: String,
    stage: String,
    state: &'static str,
    last_batch: Option<u64>,
    records: Option<u64>,
    late_records: u64,
    processing_ms: Option<u64>,
    batches: u64,
    error: Option<String>,
}

/// The member's tasks, as its events tell.
#[derive(Debug, Default)]
pub(crate) struct TaskBoard {
    rows: Mutex<BTreeMap<TaskId, TaskRow>>,
}

impl TaskBoard {
    /// Takes in what `event` says of a task.
    pub(crate) fn record(&self, event: &MemberEvent) {
        let mut guard = lock(&self.rows);
        let rows = &mut *guard;
        match event {
            MemberEvent::Assigned { tasks } => tasks.iter().for_each(|id| row(rows, id).state = "assigned"),
            MemberEvent::TaskStarted { task, .. } => row(rows, task).state = "running",
            MemberEvent::Batch { task, progress } => {
                let row = row(rows, task);
                row.state = "running";
                row.last_batch = Some(progress.batch_id.0);
                row.records = Some(progress.input_records);
                row.late_records += progress.late_records;
                row.processing_ms = Some(progress.processing_time_ms);
                row.batches += 1;
            }
            MemberEvent::TaskFailed { task, error } => {
                let row = row(rows, task);
                row.state = "restarting";
                row.error = Some(error.clone());
            }
            MemberEvent::Failed { task, error } => {
                let row = row(rows, task);
                row.state = "failed";
                row.error = Some(error.clone());
            }
            MemberEvent::TaskStopped { task } => {
                rows.remove(task);
            }
            MemberEvent::Revoked { tasks, .. } => tasks.iter().for_each(|id| drop(rows.remove(id))),
        }
    }
}

/// The row of `id` in `rows`, made when missing.
fn row<'a>(rows: &'a mut BTreeMap<TaskId, TaskRow>, id: &TaskId) -> &'a mut TaskRow {
    rows.entry(id.clone()).or_insert_with(|| TaskRow {
        task: id.to_string(),
        stage: id.stage.clone(),
        ..TaskRow::default()
    })
}

impl TaskBoard {
    fn status(&self, app: &str, member: &str) -> serde_json::Value {
        let tasks: Vec<TaskRow> = lock(&self.rows).values().cloned().collect();
        serde_json::json!({ "application": app, "member": member, "tasks": tasks })
    }
}

/// A member's servers and where they listen.
#[derive(Debug, Default)]
pub(crate) struct Served {
    /// Kept while the member lives; dropping one stops it.
    _servers: Vec<ProcessServer>,
    /// Where `/metrics` is served (port 0 resolved).
    pub(crate) metrics: Option<SocketAddr>,
    /// Where the page is served.
    pub(crate) ui: Option<SocketAddr>,
}

/// Serves `/metrics` at `metrics_addr` and the page of `board` at
/// `ui_addr` (one server when they are the same address).
pub(crate) fn serve(
    app: &str,
    member: &str,
    metrics_addr: Option<SocketAddr>,
    ui_addr: Option<SocketAddr>,
    board: &Arc<TaskBoard>,
) -> Result<Served, AppError> {
    let status: ProcessStatus = {
        let (board, app, member) = (Arc::clone(board), app.to_string(), member.to_string());
        Arc::new(move || board.status(&app, &member))
    };
    let failed = |what: &'static str, addr: SocketAddr| {
        let app = app.to_string();
        move |source| AppError::Serve { app, what, addr, source: Box::new(source) }
    };
    let mut served = Served::default();
    if let (Some(m), Some(u)) = (metrics_addr, ui_addr)
        && m == u
    {
        let both = ProcessServer::start(m, true, Some(status)).map_err(failed("/metrics and the web page", m))?;
        served.metrics = Some(both.addr());
        served.ui = Some(both.addr());
        served._servers.push(both);
        return Ok(served);
    }
    if let Some(m) = metrics_addr {
        let server = ProcessServer::start(m, true, None).map_err(failed("/metrics", m))?;
        served.metrics = Some(server.addr());
        served._servers.push(server);
    }
    if let Some(u) = ui_addr {
        let server = ProcessServer::start(u, false, Some(status)).map_err(failed("the web page", u))?;
        served.ui = Some(server.addr());
        served._servers.push(server);
    }
    Ok(served)
}
