//! The error type of spate-runtime; every variant names what it was working
//! on (the file, the batch, the output).

use std::path::{Path, PathBuf};

use spate_core::BatchId;
use spate_logstore::{Inconsistency, LockHolder};
use thiserror::Error;

/// An error from the streaming engine.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A setting is out of range.
    #[error("invalid setting {setting}: {reason}")]
    InvalidSetting {
        /// The setting.
        setting: String,
        /// Why it is refused.
        reason: String,
    },
    /// An operating-system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint directory's logs could not be read or written.
    #[error("checkpoint {dir}: {message}")]
    Checkpoint {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What the log store said.
        message: String,
    },
    /// The checkpoint directory is inconsistent (a shape recovery refuses,
    /// such as a commit ahead of its offsets); nothing was changed. The
    /// message names the files and the repair command.
    #[error("{0}")]
    Inconsistent(Box<Inconsistency>),
    /// Another live writer holds the checkpoint directory.
    #[error("checkpoint {} is in use: {}", dir.display(), describe_holder(holder.as_ref()))]
    Locked {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Who holds it (pid, host, since, epoch), as its lock file says;
        /// `None` when the lock file cannot be read yet.
        holder: Option<LockHolder>,
    },
    /// Another writer took the checkpoint directory over while this one
    /// ran (its lock epoch is newer): this writer stopped without writing.
    #[error("{message}")]
    TakenOver {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The log store's description: both epochs.
        message: String,
    },
    /// Operator state could not be saved or restored.
    #[error("state of operator {operator} at batch {batch}: {reason}")]
    State {
        /// The operator's stable name.
        operator: String,
        /// The batch of the snapshot.
        batch: BatchId,
        /// What went wrong.
        reason: String,
    },
    /// The pipeline the code declares is invalid (the graph builder's problems).
    #[error("invalid pipeline: {reason}")]
    InvalidGraph {
        /// Every problem found.
        reason: String,
    },
    /// The graph in the code does not fit the checkpoint (an incompatible change).
    #[error("the graph does not match checkpoint {dir}: {reason}")]
    IncompatibleGraph {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What differs.
        reason: String,
    },
    /// A batch could not be planned (sources, receivers, tracker).
    #[error("planning batch {batch}: {reason}")]
    Planning {
        /// The batch.
        batch: BatchId,
        /// What went wrong.
        reason: String,
    },
    /// An output job of a batch failed; the batch is not committed and the
    /// next start re-runs it.
    #[error("output {output} of batch {batch} failed: {reason}")]
    OutputFailed {
        /// The batch.
        batch: BatchId,
        /// The output's name.
        output: String,
        /// What it reported.
        reason: String,
    },
    /// A receiver or its storage failed.
    #[error("receiver of stream {stream}: {reason}")]
    Receiver {
        /// The input stream.
        stream: String,
        /// What went wrong.
        reason: String,
    },
    /// Code running a batch panicked (a user function, a listener, the
    /// engine); the batch is not committed and the next start re-runs it.
    #[error("{place} panicked: {message}")]
    Panicked {
        /// Where: the driver, an output job.
        place: String,
        /// The panic message.
        message: String,
    },
    /// The context was used in a state that does not allow it (for example
    /// started twice).
    #[error("streaming context {what}")]
    Lifecycle {
        /// What was attempted.
        what: String,
    },
}

fn describe_holder(holder: Option<&LockHolder>) -> String {
    holder.map_or_else(|| "a live writer (lock file not readable yet)".to_string(), LockHolder::to_string)
}

impl RuntimeError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        RuntimeError::Io { op, path: path.into(), source }
    }
}

/// [`RuntimeError::TakenOver`] when `error` or one of its causes is a
/// write-ahead log refusing a change because another writer holds the
/// checkpoint `dir` now; `None` for any other failure.
pub(crate) fn taken_over(dir: &Path, error: &(dyn std::error::Error + 'static)) -> Option<RuntimeError> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        // Errors keep a WAL error as such or boxed.
        let wal = e
            .downcast_ref::<spate_wal::WalError>()
            .or_else(|| e.downcast_ref::<Box<spate_wal::WalError>>().map(|boxed| &**boxed));
        if let Some(fenced @ spate_wal::WalError::Fenced { .. }) = wal {
            return Some(RuntimeError::TakenOver { dir: dir.to_path_buf(), message: fenced.to_string() });
        }
        cause = e.source();
    }
    None
}
