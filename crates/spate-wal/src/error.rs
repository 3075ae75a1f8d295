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
