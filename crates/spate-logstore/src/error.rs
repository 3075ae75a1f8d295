//! The error type of spate-logstore. Every variant names the file or
//! directory involved, so a person reading the message knows where to look.

use std::io;
use std::path::PathBuf;

use thiserror::Error;

use crate::holder::LockHolder;

/// Everything that can go wrong reading or writing a checkpoint directory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LogStoreError {
    /// An operating-system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "create", "fsync directory", …).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A put-if-absent found the file already there (another writer won).
    #[error("{} already exists; it is never overwritten", path.display())]
    AlreadyExists {
        /// The file that exists.
        path: PathBuf,
    },
    /// The file is empty (a log file always starts with its version line).
    #[error("{}: the file is empty", path.display())]
    EmptyFile {
        /// The empty file.
        path: PathBuf,
    },
    /// The file is not valid UTF-8 text.
    #[error("{}: not UTF-8 text (first invalid byte at offset {byte_offset})", path.display())]
    NotText {
        /// The file.
        path: PathBuf,
        /// The byte offset of the first invalid byte.
        byte_offset: u64,
    },
    /// The file was written by a newer spate whose log format this build cannot read.
    #[error(
        "{}: written by a newer spate (log format v{found}, this build reads up to v{supported}); \
         upgrade spate to read this checkpoint",
        path.display()
    )]
    NewerVersion {
        /// The file.
        path: PathBuf,
        /// The version in its first line.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The file's content does not have the expected shape.
    #[error("{}: malformed at line {line}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The 1-based line number where the problem is.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The file's checksum does not match its content: it was damaged after it was written.
    #[error(
        "{}: checksum mismatch (the file says {stored:08x}, its content gives {computed:08x}); \
         the file was damaged after it was written",
        path.display()
    )]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The checksum written in the file.
        stored: u32,
        /// The checksum of its content now.
        computed: u32,
    },
    /// The file is larger than any log entry should be.
    #[error("{}: {len} bytes exceeds the limit of {limit} bytes for a log file", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length (at least).
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// An entry could not be encoded.
    #[error("cannot encode the entry for {}: {reason}", path.display())]
    Encode {
        /// The file it was meant for.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// Another live process holds the checkpoint's writer lock.
    #[error("checkpoint {} is in use by another writer: {}", dir.display(), describe_holder(holder.as_ref()))]
    Locked {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Who holds the lock, as written in the lock file (`None` when it cannot be read yet).
        holder: Option<LockHolder>,
    },
    /// Another writer took the checkpoint over: this writer is stale and may not write.
    #[error(
        "checkpoint {} was taken over by another writer: our epoch is {ours}, the lock file says {on_disk}; \
         this writer must stop",
        dir.display()
    )]
    StaleEpoch {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The epoch this writer acquired.
        ours: u64,
        /// What the lock file says now (a description, since it may be unreadable or gone).
        on_disk: String,
    },
    /// The log or checkpoint was opened read-only.
    #[error("{} was opened read-only; open it for writing to change it", path.display())]
    ReadOnly {
        /// The log directory or file.
        path: PathBuf,
    },
    /// A relative path given to the checkpoint is not allowed (absolute, `..`, or a reserved name).
    #[error("{}: {reason}", path.display())]
    InvalidPath {
        /// The path given.
        path: PathBuf,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The checkpoint directory is inconsistent; the message names the files and the repair command.
    #[error("{0}")]
    Inconsistent(Box<crate::verdict::Inconsistency>),
    /// A repair plan no longer matches the directory (it changed since it was planned).
    #[error("repair plan is stale: {}: {reason}", path.display())]
    StalePlan {
        /// The file that does not match.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// A number read from a file, or asked for, is outside what the checkpoint can hold.
    #[error("{}: {reason}", path.display())]
    OutOfRange {
        /// The file the number came from or was meant for.
        path: PathBuf,
        /// Which number, and why it is refused.
        reason: String,
    },
    /// A file this writer replaced carries an older writer's epoch: a writer
    /// that had lost the checkpoint overwrote it after this one took over.
    #[error(
        "{} was overwritten by a stale writer: this writer (epoch {ours}) replaced it, but it now carries \
         epoch {found}; the stale writer must be stopped, then this file written again",
        path.display()
    )]
    Overwritten {
        /// The file.
        path: PathBuf,
        /// This writer's epoch.
        ours: u64,
        /// The epoch the file carries.
        found: u64,
    },
    /// A conditional replace found the file changed since it was read:
    /// another writer replaced it in between.
    #[error("{} was changed by another writer since it was read; not replaced", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
    },
    /// A request to the object store holding the checkpoint failed.
    #[error("{op} {}: {message}", path.display())]
    ObjectStore {
        /// What was being done ("read", "put-if-absent", "list", …).
        op: &'static str,
        /// The object, as a location (`s3://bucket/key`).
        path: PathBuf,
        /// The store's error.
        message: String,
    },
    /// The checkpoint location cannot be used (a malformed `s3://` URL, a
    /// store this build was made without, missing settings).
    #[error("checkpoint location {location}: {reason}")]
    Location {
        /// The location as given.
        location: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// A fault injected by the fault-injecting file manager (tests only).
    #[error("injected {} at {point} writing {}", if *crash { "Crash" } else { "Fail" }, path.display())]
    InjectedFault {
        /// Where the fault fired: the name of the fault point.
        point: String,
        /// True for a simulated crash (stop, leave the disk as it is), false
        /// for a failure (an error, cleaned up).
        crash: bool,
        /// The file being written.
        path: PathBuf,
    },
    /// The fault-injecting file manager "crashed" earlier and does nothing any more.
    #[error("the file manager crashed earlier; reopen the checkpoint to recover")]
    Crashed,
}

impl LogStoreError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        LogStoreError::Io { op, path: path.into(), source }
    }

    /// True when this error is a simulated crash: the caller must not clean up.
    pub(crate) fn is_crash(&self) -> bool {
        matches!(self, LogStoreError::InjectedFault { crash: true, .. } | LogStoreError::Crashed)
    }
}

fn describe_holder(holder: Option<&LockHolder>) -> String {
    match holder {
        Some(holder) => holder.to_string(),
        None => "a live process whose lock file cannot be read yet".to_string(),
    }
}

/// The result type of this crate.
pub type Result<T, E = LogStoreError> = std::result::Result<T, E>;
