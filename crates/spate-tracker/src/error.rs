//! The error type of spate-tracker: every variant names the event log (its
//! directory) and, when replaying, the record that failed.

use std::path::PathBuf;
use std::sync::Arc;

use spate_core::{CoreError, Time};
use spate_wal::WalError;
use thiserror::Error;

/// An error from the [`crate::ReceivedBlockTracker`].
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TrackerError {
    /// Opening the event log failed.
    #[error("opening the tracker log {log}: {source}")]
    LogOpen {
        /// The event log (directory).
        log: PathBuf,
        /// What the write-ahead log said.
        #[source]
        source: Box<WalError>,
    },
    /// Writing an event to the event log failed; the tracker's state is
    /// unchanged (the event did not happen).
    #[error("writing {what} to the tracker log {log}: {source}")]
    LogWrite {
        /// The event, e.g. `allocation of batch 2000 ms`.
        what: String,
        /// The event log (directory).
        log: PathBuf,
        /// What the write-ahead log said.
        #[source]
        source: Box<WalError>,
    },
    /// Reading the event log back failed.
    #[error("reading the tracker log {log} at record {record}: {source}")]
    LogRead {
        /// The event log (directory).
        log: PathBuf,
        /// The index of the record being read (0 = oldest live record).
        record: u64,
        /// What the write-ahead log said.
        #[source]
        source: Box<WalError>,
    },
    /// Deleting old segments of the event log failed.
    #[error("cleaning the tracker log {log} before {threshold}: {source}")]
    LogClean {
        /// The event log (directory).
        log: PathBuf,
        /// The time before which segments were to be deleted.
        threshold: Time,
        /// What the write-ahead log said.
        #[source]
        source: Box<WalError>,
    },
    /// Closing the event log failed.
    #[error("closing the tracker log {log}: {source}")]
    LogClose {
        /// The event log (directory).
        log: PathBuf,
        /// What the write-ahead log said.
        #[source]
        source: Box<WalError>,
    },
    /// A record of the event log could not be decoded.
    #[error("tracker log {log}, record {record}: {source}")]
    BadRecord {
        /// The event log (directory).
        log: PathBuf,
        /// The index of the record (0 = oldest live record).
        record: u64,
        /// Why the record does not decode: [`TrackerError::NewerFormat`],
        /// [`TrackerError::UnknownFormat`] or [`TrackerError::CorruptRecord`].
        #[source]
        source: Box<TrackerError>,
    },
    /// An event record was written by a newer spate.
    #[error("written by a newer spate (event format {found}, this build reads formats 1 to {supported})")]
    NewerFormat {
        /// The format version in the record.
        found: u16,
        /// The newest format this build reads.
        supported: u16,
    },
    /// An event record carries a format version no spate ever wrote.
    #[error("event format {found} is unknown (this build reads formats 1 to {supported})")]
    UnknownFormat {
        /// The format version in the record.
        found: u16,
        /// The newest format this build reads.
        supported: u16,
    },
    /// An event record is not a valid frame of its format (damaged
    /// header, checksum, payload or trailing bytes).
    #[error("damaged event record (format {version:?}): {source}")]
    CorruptRecord {
        /// The format version in the frame, when its header was readable.
        version: Option<u16>,
        /// What the frame decoder said.
        #[source]
        source: CoreError,
    },
    /// Block additions were not logged, so they were not queued: the
    /// receiver must not acknowledge them.
    #[error("{blocks} block addition(s) not logged, so not queued: {source}")]
    AdditionNotLogged {
        /// The caller's blocks.
        blocks: usize,
        /// Why the group commit holding them failed (shared by every
        /// caller of the group).
        #[source]
        source: Arc<TrackerError>,
    },
    /// A panic interrupted a change of the tracker: whether its record
    /// reached the log is unknown, so the tracker takes no more changes.
    #[error(
        "the tracker takes no more changes: a panic interrupted {during}; restart to rebuild its state from the \
         event log"
    )]
    Poisoned {
        /// What was being done, e.g. `logging block additions`.
        during: &'static str,
    },
    /// An event could not be encoded.
    #[error("encoding {what} for the tracker log: {source}")]
    Encode {
        /// The event.
        what: String,
        /// What the frame encoder said.
        #[source]
        source: CoreError,
    },
    /// A cleanup threshold later than the clock's present would delete log
    /// records that describe blocks not yet processed.
    #[error("cleanup threshold {threshold} is after the present ({now}); refusing to delete records still needed")]
    CleanupThresholdInFuture {
        /// The threshold asked for.
        threshold: Time,
        /// The clock's present.
        now: Time,
    },
    /// Recovered blocks whose data died with the previous process and has no
    /// copy in the receiver write-ahead log.
    #[error("{summary}")]
    UnrecoverableData {
        /// Which streams lost how many blocks and records (the report's text).
        summary: String,
    },
}
