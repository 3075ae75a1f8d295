//! The error type of spate-files. Every variant names the sink's location
//! and, where there is one, the batch and the file involved.

use std::path::PathBuf;

use spate_core::BatchId;
use spate_logstore::LogStoreError;
use thiserror::Error;

/// Everything that can go wrong writing a batch's files.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FilesError {
    /// The settings cannot work.
    #[error("file sink {location}: {reason}")]
    Settings {
        /// The sink's root.
        location: String,
        /// What is wrong.
        reason: String,
    },
    /// The disk or the object store refused an operation.
    #[error("file sink {location}: cannot {what}: {source}")]
    Store {
        /// The sink's root.
        location: String,
        /// What the sink was doing ("stage a file of batch 7", …).
        what: String,
        /// The store's error, which names the file.
        #[source]
        source: LogStoreError,
    },
    /// A record could not be written as JSON.
    #[error("file sink {location}: a record of batch {batch_id} cannot be written as JSON: {source}")]
    Encode {
        /// The sink's root.
        location: String,
        /// The batch.
        batch_id: BatchId,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// One record is larger than a file may be.
    #[error(
        "file sink {location}: a record of batch {batch_id} is {bytes} bytes as JSON, more than a file may hold \
         ({limit} bytes)"
    )]
    RecordTooLarge {
        /// The sink's root.
        location: String,
        /// The batch.
        batch_id: BatchId,
        /// The record's length as a JSON line.
        bytes: u64,
        /// The most a file may hold.
        limit: u64,
    },
    /// A manifest is damaged or not this sink's.
    #[error("file sink manifest {}: {reason}", path.display())]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A final name is taken by a file that is not the one the batch published.
    #[error(
        "{}: the file exists and is not the one batch {batch_id} wrote ({reason}); another job writes under this \
         root, or the file was changed by hand: give each job a root of its own",
        path.display()
    )]
    Conflict {
        /// The file in the way.
        path: PathBuf,
        /// The batch that was publishing.
        batch_id: BatchId,
        /// How it differs.
        reason: String,
    },
    /// A pending batch's file is neither staged nor published.
    #[error(
        "{}: batch {batch_id} listed this file in its manifest, but it is neither staged nor published; \
         something removed it",
        path.display()
    )]
    Missing {
        /// The final path of the file.
        path: PathBuf,
        /// The batch.
        batch_id: BatchId,
    },
}

/// The result type of spate-files.
pub type Result<T, E = FilesError> = std::result::Result<T, E>;
