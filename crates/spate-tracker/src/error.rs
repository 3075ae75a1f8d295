//! The error type of spate-tracker: every variant names the event log (its
//! directory) and, when replaying, the record that failed.

use std::path::PathBuf;

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
        source: WalError,
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
        source: WalError,
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
        source: WalError,
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
        source: WalError,
    },
    /// Closing the event log failed.
    #[error("closing the tracker log {log}: {source}")]
    LogClose {
        /// The event log (directory).
        log: PathBuf,
        /// What the write-ahead log said.
        #[source]
        source: WalError,
    },
    /// A record of the event log was written by a newer spate.
    #[error(
        "tracker log {log}, record {record}: written by a newer spate (event format {found}, this build reads up to {supported})"
    )]
    NewerFormat {
        /// The event log (directory).
        log: PathBuf,
        /// The index of the record (0 = oldest live record).
        record: u64,
        /// The format version in the record.
        found: u16,
        /// The newest format this build reads.
        supported: u16,
    },
    /// A record of the event log passed the log's checksum but is not a
    /// valid event frame.
    #[error("tracker log {log}, record {record} is damaged: {source}")]
    CorruptRecord {
        /// The event log (directory).
        log: PathBuf,
        /// The index of the record (0 = oldest live record).
        record: u64,
        /// What the frame decoder said.
        #[source]
        source: CoreError,
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
