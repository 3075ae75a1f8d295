//! A segmented, CRC-framed write-ahead log.
//!
//! The receiver keeps received blocks here until they are processed, and the
//! `ReceivedBlockTracker` keeps its event log here (Spark's
//! `FileBasedWriteAheadLog`). Records are opaque bytes written at a time;
//! the log hands back a [`WalRecordHandle`] once the record is durable.

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod log;

pub use error::WalError;
pub use log::{RecordIter, WriteAheadLog};
pub use spate_core::WalRecordHandle;
