//! The command's error type, its exit codes, and how an error is shown:
//! one sentence saying what failed, then the chain of causes.

use std::fmt::Write as _;
use std::path::PathBuf;

use spate_logstore::LogStoreError;
use thiserror::Error;

/// The process exit codes of `spate` (also listed in `spate --help`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitCode {
    /// 0: the command did what was asked (a job stopped by a signal stopped gracefully).
    Ok = 0,
    /// 1: a runtime error (I/O, a failed batch, a broken source or sink).
    Runtime = 1,
    /// 2: a usage error (unknown flag, bad value, malformed `--json`).
    Usage = 2,
    /// 3: the checkpoint is inconsistent, or the change was refused to keep it consistent.
    Refused = 3,
    /// 4: another live process holds the checkpoint's writer lock, or took
    /// it over while this one ran.
    Locked = 4,
    /// 130: stopped at once by a second signal, without finishing the queued batches.
    Interrupted = 130,
}

impl ExitCode {
    /// The number the process exits with.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// Everything `spate` can fail with. Each variant says what was being done;
/// the cause (from the library crates) follows as the error's source.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CliError {
    /// A command-line argument is wrong.
    #[error("{message}")]
    Usage {
        /// What is wrong, naming the argument.
        message: String,
    },
    /// A `--json` value does not parse.
    #[error("the value of {flag} is not valid JSON")]
    BadJson {
        /// The flag whose value is wrong.
        flag: &'static str,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A member of an application failed to start, run or leave.
    #[cfg(feature = "kafka")]
    #[error("the application member failed")]
    App {
        /// The cause.
        #[source]
        source: Box<spate_app::AppError>,
    },
    /// An operation on a checkpoint directory failed.
    #[error("{action} {}", dir.display())]
    Checkpoint {
        /// What was being done ("cannot open checkpoint", …).
        action: &'static str,
        /// The checkpoint directory.
        dir: PathBuf,
        /// What the log store said.
        #[source]
        source: LogStoreError,
    },
    /// The change was refused so the checkpoint stays consistent.
    #[error("{message}")]
    Refused {
        /// Why, and what to do instead.
        message: String,
    },
    /// A file or directory could not be read or written.
    #[error("cannot {op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The streaming runtime refused to start or failed while running.
    #[error("{action} {}", dir.display())]
    Runtime {
        /// What was being done.
        action: &'static str,
        /// The checkpoint directory.
        dir: PathBuf,
        /// What the runtime said.
        #[source]
        source: spate_runtime::RuntimeError,
    },
    /// A Kafka client could not be created or failed.
    #[cfg(feature = "kafka")]
    #[error("{what}")]
    Kafka {
        /// What was being done.
        what: &'static str,
        /// What spate-kafka said.
        #[source]
        source: Box<spate_kafka::KafkaError>,
    },
    /// The file sink of a job's output could not be opened.
    #[error("cannot write files to {}", location.display())]
    Files {
        /// The sink's location.
        location: PathBuf,
        /// What spate-files said.
        #[source]
        source: Box<spate_files::FilesError>,
    },
    /// The job was stopped at once by a second signal.
    #[error("stopped at once by a second signal; the last batch was not committed and will re-run at the next start")]
    Interrupted,
}

impl CliError {
    /// A usage error with `message`.
    pub fn usage(message: impl Into<String>) -> Self {
        CliError::Usage { message: message.into() }
    }

    /// A checkpoint operation on `dir` that failed with `source`.
    pub fn checkpoint(action: &'static str, dir: impl Into<PathBuf>, source: LogStoreError) -> Self {
        CliError::Checkpoint { action, dir: dir.into(), source }
    }

    /// An I/O failure of `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CliError::Io { op, path: path.into(), source }
    }

    /// The exit code this error ends the process with.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage { .. } | CliError::BadJson { .. } => ExitCode::Usage,
            CliError::Refused { .. } => ExitCode::Refused,
            CliError::Checkpoint { source, .. } => match source {
                LogStoreError::Locked { .. } | LogStoreError::StaleEpoch { .. } => ExitCode::Locked,
                LogStoreError::Inconsistent(_) | LogStoreError::StalePlan { .. } => ExitCode::Refused,
                _ => ExitCode::Runtime,
            },
            CliError::Runtime { source, .. } => runtime_exit_code(source),
            CliError::Io { .. } => ExitCode::Runtime,
            CliError::Files { source, .. } => match source.as_ref() {
                spate_files::FilesError::Settings { .. }
                | spate_files::FilesError::Store { source: LogStoreError::Location { .. }, .. } => ExitCode::Usage,
                _ => ExitCode::Runtime,
            },
            #[cfg(feature = "kafka")]
            CliError::Kafka { .. } => ExitCode::Runtime,
            #[cfg(feature = "kafka")]
            CliError::App { source } => match source.as_ref() {
                spate_app::AppError::Invalid { .. } => ExitCode::Usage,
                spate_app::AppError::Task { source, .. } => runtime_exit_code(source),
                spate_app::AppError::MemberIdInUse { .. } => ExitCode::Locked,
                _ => ExitCode::Runtime,
            },
            CliError::Interrupted => ExitCode::Interrupted,
        }
    }
}

fn runtime_exit_code(error: &spate_runtime::RuntimeError) -> ExitCode {
    use spate_runtime::RuntimeError as E;
    match error {
        E::Locked { .. } | E::TakenOver { .. } => ExitCode::Locked,
        E::Inconsistent(_) | E::IncompatibleGraph { .. } => ExitCode::Refused,
        E::InvalidSetting { .. } => ExitCode::Usage,
        _ => ExitCode::Runtime,
    }
}

/// `Error: <what failed>` then one `  caused by: <cause>` line per cause.
pub fn render_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = format!("Error: {error}");
    let mut cause = error.source();
    while let Some(inner) = cause {
        // Writing to a String cannot fail.
        let _ = write!(text, "\n  caused by: {inner}");
        cause = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_shown_one_cause_a_line() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "permission denied");
        let store = LogStoreError::Io { op: "read", path: PathBuf::from("/ck/offsets/3"), source: io };
        let error = CliError::checkpoint("cannot inspect checkpoint", "/ck", store);
        assert_eq!(
            render_error(&error),
            "Error: cannot inspect checkpoint /ck\n  caused by: read /ck/offsets/3: permission denied\n  \
             caused by: permission denied"
        );
        assert_eq!(error.exit_code(), ExitCode::Runtime);
    }

    #[test]
    fn lock_and_inconsistency_have_their_own_codes() {
        let locked = LogStoreError::Locked { dir: PathBuf::from("/ck"), holder: None };
        assert_eq!(CliError::checkpoint("cannot open", "/ck", locked).exit_code(), ExitCode::Locked);
        let stale = LogStoreError::StalePlan { path: PathBuf::from("/ck/commits/2"), reason: "gone".into() };
        assert_eq!(CliError::checkpoint("cannot repair", "/ck", stale).exit_code(), ExitCode::Refused);
        let locked = spate_runtime::RuntimeError::Locked { dir: PathBuf::from("/ck"), holder: None };
        let error = CliError::Runtime { action: "cannot run", dir: PathBuf::from("/ck"), source: locked };
        assert_eq!(error.exit_code(), ExitCode::Locked);
        let taken_over = spate_runtime::RuntimeError::TakenOver { dir: PathBuf::from("/ck"), message: "gone".into() };
        let error = CliError::Runtime { action: "cannot run", dir: PathBuf::from("/ck"), source: taken_over };
        assert_eq!(error.exit_code(), ExitCode::Locked);
        assert_eq!(CliError::usage("x").exit_code(), ExitCode::Usage);
        assert_eq!(ExitCode::Interrupted.code(), 130);
    }

    #[cfg(feature = "kafka")]
    #[test]
    fn a_member_id_another_live_member_uses_exits_as_locked() {
        let in_use = spate_app::AppError::MemberIdInUse {
            app: "wordcount".into(),
            member_id: "m1".into(),
            holder: "pid 7 on host h".into(),
        };
        let error = CliError::App { source: Box::new(in_use) };
        assert_eq!(error.exit_code(), ExitCode::Locked);
        assert!(render_error(&error).contains("another live member uses the member id m1"), "{}", render_error(&error));
    }

    #[test]
    fn the_runtimes_inconsistency_is_refused_by_its_type_not_its_text() {
        let inconsistency = spate_logstore::Inconsistency {
            dir: PathBuf::from("/ck"),
            kind: spate_logstore::InconsistencyKind::CommitAhead {
                last_offsets: Some(spate_core::BatchId(0)),
                last_commit: spate_core::BatchId(1),
            },
            files: vec![PathBuf::from("commits/1"), PathBuf::from("offsets/1")],
            shape: spate_logstore::CheckpointShape::default(),
        };
        let refused = spate_runtime::RuntimeError::Inconsistent(Box::new(inconsistency));
        let error = CliError::Runtime { action: "cannot run", dir: PathBuf::from("/ck"), source: refused };
        assert_eq!(error.exit_code(), ExitCode::Refused);
        assert!(render_error(&error).contains("spate checkpoint repair /ck --apply"), "{}", render_error(&error));
        // A checkpoint failure whose text merely mentions an inconsistency is a runtime error.
        let message = "offsets/3 of checkpoint /ck is inconsistent: with itself".to_string();
        let other = spate_runtime::RuntimeError::Checkpoint { dir: PathBuf::from("/ck"), message };
        let error = CliError::Runtime { action: "cannot run", dir: PathBuf::from("/ck"), source: other };
        assert_eq!(error.exit_code(), ExitCode::Runtime);
    }
}
