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
    /// The writer fence refused an operation: another writer holds the
    /// checkpoint now. The log refuses every later change, like a poisoned one.
    #[error("write-ahead log {dir}: the writer of epoch {epoch} may no longer {op}: {reason}")]
    Fenced {
        /// The log directory.
        dir: PathBuf,
        /// This writer's epoch.
        epoch: u64,
        /// What it was about to do (`append`, `roll`, `clean`, `truncate`, …).
        op: &'static str,
        /// The fence's account of who holds the checkpoint.
        reason: String,
    },
    /// The directory holds a file written by a writer of a later epoch than
    /// this one: this writer is stale and may not open the log.
    #[error("write-ahead log {dir}: {file} was written by epoch {found}, later than this writer's epoch {ours}")]
    NewerEpoch {
        /// The log directory.
        dir: PathBuf,
        /// The file of the later epoch.
        file: String,
        /// Its epoch.
        found: u64,
        /// This writer's epoch.
        ours: u64,
    },
    /// A segment's header (its first page) is damaged or does not match
    /// its file name.
    #[error("bad header in segment {segment}: {reason}")]
    BadSegmentHeader {
        /// The segment file.
        segment: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A segment was written in a newer format than this build reads.
    #[error("segment {segment} has format version {found}, newer than version {supported} that this build reads")]
    NewerSegmentVersion {
        /// The segment file.
        segment: PathBuf,
        /// The version its header gives.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// A seal file (the list of an earlier epoch's segments and their
    /// lengths) is damaged or of an unknown version.
    #[error("bad seal file {path}: {reason}")]
    BadSeal {
        /// The seal file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
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
            WalError::Fenced { dir, epoch, op, reason } => {
                WalError::Fenced { dir: dir.clone(), epoch: *epoch, op, reason: reason.clone() }
            }
            WalError::NewerEpoch { dir, file, found, ours } => {
                WalError::NewerEpoch { dir: dir.clone(), file: file.clone(), found: *found, ours: *ours }
            }
            WalError::BadSegmentHeader { segment, reason } => {
                WalError::BadSegmentHeader { segment: segment.clone(), reason: reason.clone() }
            }
            WalError::NewerSegmentVersion { segment, found, supported } => {
                WalError::NewerSegmentVersion { segment: segment.clone(), found: *found, supported: *supported }
            }
            WalError::BadSeal { path, reason } => WalError::BadSeal { path: path.clone(), reason: reason.clone() },
        }
    }

    /// An [`WalError::Io`] for `op` on `path`.
    pub(crate) fn io(op: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> WalError {
        let path = path.to_path_buf();
        move |source| WalError::Io { op, path, source }
    }
}
