//! The application crate's errors.

use std::path::PathBuf;

use thiserror::Error;

/// What can go wrong starting or running a member of an application.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AppError {
    /// The topology or the settings are inconsistent.
    #[error("application {app}: {reason}")]
    Invalid {
        /// The application.
        app: String,
        /// What is wrong.
        reason: String,
    },
    /// A Kafka operation failed.
    #[error("application {app}: {what}: {source}")]
    Kafka {
        /// The application.
        app: String,
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: Box<spate_kafka::KafkaError>,
    },
    /// A task's streaming context failed to open or run.
    #[error("task {task} of application {app} (checkpoint {checkpoint}): {source}")]
    Task {
        /// The application.
        app: String,
        /// The task (`<topic>-<partition>`).
        task: String,
        /// The task's checkpoint.
        checkpoint: PathBuf,
        /// The cause.
        #[source]
        source: Box<spate_runtime::RuntimeError>,
    },
    /// A record of an internal topic could not be decoded.
    #[error("record {offset} of internal topic {topic}/{partition}: {reason}")]
    BadInternalRecord {
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// What is wrong.
        reason: String,
    },
    /// Another live member of the application runs under this member id
    /// (its lock at the checkpoint location is held): two would fence each
    /// other's transactional producer for as long as both ran.
    #[error(
        "application {app}: another live member uses the member id {member_id} ({holder}); \
         give each member an id of its own"
    )]
    MemberIdInUse {
        /// The application.
        app: String,
        /// The member id.
        member_id: String,
        /// The live member, as its lock records it.
        holder: String,
    },
    /// The member's metrics or web page could not be served.
    #[error("application {app}: cannot serve {what} at {addr}: {source}")]
    Serve {
        /// The application.
        app: String,
        /// `/metrics` or the web page.
        what: &'static str,
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: Box<spate_runtime::RuntimeError>,
    },
    /// The application's checkpoint location could not be read.
    #[error("application checkpoint {location}: {source}")]
    Location {
        /// The location.
        location: PathBuf,
        /// The cause.
        #[source]
        source: Box<spate_logstore::LogStoreError>,
    },
}

impl AppError {
    /// True for an error that trying again cannot mend: the stage's
    /// pipeline (or its settings) is refused, as it will be on every try.
    pub(crate) fn is_lasting(&self) -> bool {
        use spate_runtime::RuntimeError;
        match self {
            AppError::Invalid { .. } => true,
            AppError::Task { source, .. } => matches!(
                **source,
                RuntimeError::InvalidGraph { .. }
                    | RuntimeError::InvalidSetting { .. }
                    | RuntimeError::IncompatibleGraph { .. }
            ),
            _ => false,
        }
    }
}
