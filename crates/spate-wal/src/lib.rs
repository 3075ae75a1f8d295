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
//! - fencing ([`WalSettings::with_fence`]): the writer's
//!   [`spate_core::WriterFence`] is checked before every append (by the
//!   group-commit leader, under the writer lock, right before the bytes are
//!   written) and before every roll, truncation, deletion and recycling; a
//!   failed check is [`WalError::Fenced`], after which the log refuses every
//!   change like a poisoned one;
//! - the writer's epoch in the name of every segment it creates
//!   (`log-<startMs>-<endMs>-e<epoch>`; a name without the suffix is epoch 0,
//!   what an unfenced writer and older versions write): a writer never
//!   appends to, truncates or recycles a segment of another epoch, because
//!   the check and the write cannot be made one step and a stale writer may
//!   still be appending. Instead, on its first open a writer of epoch `E`
//!   durably writes a seal, `seal-e<E>` (versioned, CRC-checked, written to
//!   a temporary file, synced, linked into place without replacing anything,
//!   directory synced), listing every earlier-epoch segment and its valid
//!   length. Ordered reads ([`WriteAheadLog::read_all`], what the tracker
//!   replays) read such a segment only that far and skip earlier-epoch
//!   segments the seal does not list, so bytes a stale writer lands after
//!   the takeover are never replayed; reads by handle work on every
//!   segment. A directory holding a segment, spare or seal of a later epoch
//!   is refused ([`WalError::NewerEpoch`]). Recycled files carry the epoch
//!   too (`spare-e<epoch>-<n>`), and a writer only uses its own: those of
//!   earlier epochs are deleted when it opens, never adopted;
//! - owner-only files: the directory (and any parent it creates) is 0700,
//!   every segment, spare and seal 0600; an existing directory or log file
//!   with wider modes is tightened on open, with a log line saying so;
//! - a versioned header at the start of every segment: one 4096-byte page
//!   holding the magic `SPATEWAL`, the format version (1), the writer's
//!   epoch (the `-e<epoch>` of the name) and a CRC32C of those fields, the
//!   rest zero; records follow it, page-aligned as direct I/O expects, and
//!   a record's handle gives its absolute byte offset in the file (so the
//!   first record of a segment is at 4096). Every reader (by handle, in
//!   order, recovery and sealing) checks the header: a damaged one, or one
//!   whose epoch is not the name's, is [`WalError::BadSegmentHeader`]; a
//!   newer format is [`WalError::NewerSegmentVersion`], naming the file and
//!   both versions. A segment that does not start with the magic was
//!   written before segments had a header: its records start at offset 0
//!   and it is read, and appended to, as before. A last segment that ends
//!   inside its header (its creation was cut short) is a torn tail;
//!   anywhere else that is damage;
//! - a length and two CRC32Cs on every record; reading by handle or in
//!   order checks them and names the segment and byte offset of any damage;
//! - group commit: concurrent writers share one append and one `fdatasync`,
//!   and each gets its handle only after the sync that covers its record;
//! - recovery on open: a torn record at the end of the last segment is cut
//!   off; damage anywhere else is an error (or skipped in salvage mode);
//! - optional direct I/O for logs of large records ([`WalSettings::direct_io`]):
//!   a large record is padded so that its pages go to the device straight
//!   from the caller's buffer;
//! - optional recycling of cleaned segment files ([`WalSettings::recycled_segments`]):
//!   kept zeroed, with their blocks allocated, and rewritten by new segments,
//!   which on thin-provisioned disks is much faster than writing new files;
//! - a log that refuses every write after a failed append, sync or
//!   directory sync ([`WalError::Poisoned`]);
//! - with the `failpoints` feature, a `FaultInjection` hook for tests: counts operations; fails a chosen
//!   sync, append, truncation, directory sync or rename; fills the device
//!   or cuts an append short (`AppendFault`); holds a sync or an append
//!   until the test releases it (`SyncHold`); and simulates a crash that
//!   loses every byte written since the last successful sync.
//!
//! It is not a key-value store, nor a replicated log, and it does not
//! interpret records: callers frame typed payloads themselves (for example
//! with `spate_core::FrameCodec`).
//!
//! ```
//! use spate_core::Time;
//! use spate_wal::{FileWriteAheadLog, WalSettings, WriteAheadLog};
//!
//! let dir = tempfile::tempdir()?;
//! let log = FileWriteAheadLog::open(dir.path(), WalSettings::default())?;
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
//! drop(log);
//!
//! // A fenced writer of epoch 2 takes the directory over: it seals the
//! // unfenced (epoch 0) segment and names its own segments with its epoch.
//! #[derive(Debug)]
//! struct Epoch2;
//! impl spate_core::WriterFence for Epoch2 {
//!     fn epoch(&self) -> u64 { 2 }
//!     fn check(&self) -> Result<(), String> { Ok(()) }
//! }
//! let options = WalSettings::default().with_fence(std::sync::Arc::new(Epoch2));
//! let log = FileWriteAheadLog::open(dir.path(), options)?;
//! log.write(b"block 3", Time::from_millis(61_500))?;
//! assert_eq!(log.segment_names(), vec!["log-61000-121000", "log-61500-121500-e2"]);
//! let all: Vec<Vec<u8>> = log.read_all()?.collect::<Result<_, _>>()?;
//! assert_eq!(all, vec![b"block 2".to_vec(), b"block 3".to_vec()]);
//! // An unfenced writer (epoch 0) may no longer open it.
//! assert!(FileWriteAheadLog::open(dir.path(), WalSettings::default()).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod cleaner;
#[cfg(target_os = "linux")]
mod direct;
mod error;
#[cfg(feature = "failpoints")]
mod faults;
mod file_log;
mod files;
mod header;
mod log;
mod reader;
mod record;
mod seal;
mod segment;
mod settings;
mod spares;
mod takeover;
mod telemetry;
mod writer;

pub use error::WalError;
#[cfg(feature = "failpoints")]
pub use faults::{AppendFault, FaultInjection, SyncHold};
pub use file_log::FileWriteAheadLog;
pub use log::{RecordIter, WriteAheadLog};
pub use settings::{DEFAULT_MAX_RECORD_SIZE, SyncPolicy, WalSettings};
pub use spate_core::WalRecordHandle;
