//! A segmented, CRC-framed write-ahead log with group commit and torn-tail
//! recovery.
//!
//! The receiver keeps received blocks here until they are processed, and the
//! `ReceivedBlockTracker` keeps its event log here (Spark's
//! `FileBasedWriteAheadLog`). Records are opaque bytes written at a time;
//! the log hands back a [`WalRecordHandle`] once the record is durable.
//!
//! It features:
//! - a directory of segments named `log-<startMs>-<endMs>`, a new one every
//!   rolling interval (by the records' times), deleted whole by [`WriteAheadLog::clean`];
//! - a length and two CRC32Cs on every record; reading by handle or in
//!   order checks them and names the segment and byte offset of any damage;
//! - group commit: concurrent writers share one append and one `fdatasync`,
//!   and each gets its handle only after the sync that covers its record;
//! - recovery on open: a torn record at the end of the last segment is cut
//!   off; damage anywhere else is an error (or skipped in salvage mode);
//! - optional direct I/O for logs of large records ([`WalOptions::direct_io`]):
//!   a large record is padded so that its pages go to the device straight
//!   from the caller's buffer;
//! - optional recycling of cleaned segment files ([`WalOptions::recycled_segments`]):
//!   kept zeroed, with their blocks allocated, and rewritten by new segments,
//!   which on thin-provisioned disks is much faster than writing new files;
//! - a log that refuses every write after a failed sync ([`WalError::Poisoned`]);
//! - a [`FaultInjection`] hook that counts syncs and fails chosen ones, for tests.
//!
//! It is not a key-value store, nor a replicated log, and it does not
//! interpret records: callers frame typed payloads themselves (for example
//! with `spate_core::FrameCodec`).
//!
//! ```
//! use spate_core::Time;
//! use spate_wal::{FileWriteAheadLog, WalOptions, WriteAheadLog};
//!
//! let dir = tempfile::tempdir()?;
//! let log = FileWriteAheadLog::open(dir.path(), WalOptions::default())?;
//! let handle = log.write(b"block 1", Time::from_millis(1_000))?;
//! log.write(b"block 2", Time::from_millis(61_000))?; // a new segment
//! assert_eq!(log.read(&handle)?, b"block 1");
//!
//! let all: Vec<Vec<u8>> = log.read_all()?.collect::<Result<_, _>>()?;
//! assert_eq!(all, vec![b"block 1".to_vec(), b"block 2".to_vec()]);
//!
//! log.clean(Time::from_millis(70_000), true)?; // deletes log-1000-61000
//! assert_eq!(log.segment_names(), vec!["log-61000-121000"]);
//! log.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod cleaner;
#[cfg(target_os = "linux")]
mod direct;
mod error;
mod file_log;
mod files;
mod log;
mod options;
mod reader;
mod record;
mod segment;
mod spares;
mod writer;

pub use error::WalError;
pub use file_log::FileWriteAheadLog;
pub use files::FaultInjection;
pub use log::{RecordIter, WriteAheadLog};
pub use options::{DEFAULT_MAX_RECORD_SIZE, SyncPolicy, WalOptions};
pub use spate_core::WalRecordHandle;
