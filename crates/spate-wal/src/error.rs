//! The error type of spate-wal; every variant names the file involved.

use std::path::PathBuf;

use thiserror::Error;

/// An error from a write-ahead log.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WalError {
    /// An operating-system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`open`, `write`, `fdatasync`, …).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A record that is not at the torn tail of the last segment is damaged.
    #[error("corrupt record in {segment} at byte {offset}: {reason}")]
    Corrupt {
        /// The segment file.
        segment: PathBuf,
        /// Byte offset of the damaged record.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A sync failed earlier; the log refuses every write since, because the
    /// state of the unsynced data on disk is unknown.
    #[error("write-ahead log {dir} is poisoned: an earlier fsync failed ({cause}); reopen it to recover")]
    Poisoned {
        /// The log directory.
        dir: PathBuf,
        /// The failure that poisoned it.
        cause: String,
    },
    /// The record is larger than the configured maximum.
    #[error("record of {len} bytes exceeds the maximum record size of {max} bytes")]
    RecordTooLarge {
        /// Bytes in the record.
        len: u64,
        /// The configured maximum.
        max: u64,
    },
    /// A handle that does not point at a record of this log.
    #[error("no record at {handle} in {dir}: {reason}")]
    BadHandle {
        /// The handle as displayed.
        handle: String,
        /// The log directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// The log was closed.
    #[error("write-ahead log {dir} is closed")]
    Closed {
        /// The log directory.
        dir: PathBuf,
    },
}

impl WalError {
    /// A copy of this error for another waiter of the same failed batch
    /// (the OS error is carried over by kind and message).
    pub(crate) fn duplicate(&self) -> WalError {
        match self {
            WalError::Io { op, path, source } => {
                WalError::Io { op, path: path.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
            WalError::Corrupt { segment, offset, reason } => {
                WalError::Corrupt { segment: segment.clone(), offset: *offset, reason: reason.clone() }
            }
            WalError::Poisoned { dir, cause } => WalError::Poisoned { dir: dir.clone(), cause: cause.clone() },
            WalError::RecordTooLarge { len, max } => WalError::RecordTooLarge { len: *len, max: *max },
            WalError::BadHandle { handle, dir, reason } => {
                WalError::BadHandle { handle: handle.clone(), dir: dir.clone(), reason: reason.clone() }
            }
            WalError::Closed { dir } => WalError::Closed { dir: dir.clone() },
        }
    }

    /// An [`WalError::Io`] for `op` on `path`.
    pub(crate) fn io(op: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> WalError {
        let path = path.to_path_buf();
        move |source| WalError::Io { op, path, source }
    }
}
