//! The metadata logs of a spate checkpoint directory: what was planned
//! (`offsets/N`), what finished (`commits/N`), who may write, and what a
//! restart must do.
//!
//! It features:
//!
//! - [`CheckpointFileManager`]: list, read, put-if-absent atomic create
//!   (temp file, fsync, writer's fence, link without overwrite, directory
//!   fsync), conditional replace, append, delete, the writer lock;
//!   [`file_manager_for`] picks one by location: `ObjectStoreFileManager`
//!   for `s3://bucket/prefix` (feature `s3`: conditional puts, no rename,
//!   the lock a lease), [`LocalFileManager`] on the local file system and,
//!   with the `failpoints` feature, `FaultyFileManager`, which fails (an
//!   error, a full disk) or "crashes" at every step of a write
//!   ([`FaultPoint`]), with short writes, and with crashes that lose what
//!   was not synced;
//! - [`MetadataLog`] with Spark's `HDFSMetadataLog` semantics: write-once
//!   entries named by their decimal batch id, a `v1` line then JSON ending in
//!   a checksum field that Spark ignores; [`OffsetLog`] (readable from a
//!   Spark checkpoint's `offsets/N`, with stable source names) and
//!   [`CommitLog`];
//! - the writer lock ([`WriterLock`]): one live writer, takeover of a dead
//!   one's lock with the next epoch, and an epoch check ([`EpochFence`], a
//!   [`spate_core::WriterFence`]) immediately before every change becomes
//!   visible;
//! - the recovery verdict ([`inspect`], [`Verdict`]), reading only the newest
//!   entries and the operator state snapshots the runtime keeps
//!   ([`StateShape`]: none may be newer than the last commit), and the
//!   repair of inconsistent directories ([`plan_repair`], [`apply_repair`])
//!   that moves files to `_quarantine/`, never deletes, and takes the state
//!   back with the commits it moves ([`StateRollback`]);
//! - [`Checkpoint`], the handle that ties these together, and keeps
//!   everything under the checkpoint owner-only.
//!
//! Numbers read from the directory are never trusted: a batch id that no
//! batch could follow (`offsets/18446744073709551615`) is an inconsistency
//! naming the file, like any other.
//!
//! It is not the write-ahead log (spate-wal), the state store or the
//! runtime's recovery logic: it says where to restart, the runtime restarts.
//!
//! ```
//! use spate_core::{BatchId, Time};
//! use spate_logstore::{Checkpoint, CheckpointSettings, CommitMetadata, OffsetSeq, SourceOffset, Verdict};
//!
//! let dir = tempfile::tempdir()?;
//! let checkpoint = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new())?;
//! assert_eq!(checkpoint.verdict()?, Verdict::Fresh);
//!
//! let offsets = OffsetSeq {
//!     batch_timestamp: Time::from_millis(1_700_000_000_000),
//!     sources: vec![SourceOffset::new("events", Some(serde_json::json!({"events": {"0": 36}})))],
//!     ..OffsetSeq::default()
//! };
//! assert!(checkpoint.offsets().add(BatchId(0), &offsets)?); // before the batch runs
//! assert!(matches!(checkpoint.verdict()?, Verdict::Rerun { batch: BatchId(0), .. }));
//!
//! assert!(checkpoint.commits().add(BatchId(0), &CommitMetadata::default())?); // after its outputs
//! assert!(matches!(checkpoint.verdict()?, Verdict::Resume { next: BatchId(1), .. }));
//! assert!(!checkpoint.commits().add(BatchId(0), &CommitMetadata::default())?); // never overwritten
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod checkpoint;
mod entries;
mod error;
#[cfg(feature = "failpoints")]
mod fault;
mod file_manager;
mod holder;
mod lease;
mod location;
mod lock;
mod log;
#[cfg(all(feature = "s3", feature = "failpoints"))]
mod object_faults;
#[cfg(feature = "s3")]
mod object_files;
#[cfg(feature = "s3")]
mod object_parts;
#[cfg(feature = "s3")]
mod object_reader;
mod process;
mod repair;
mod state;
mod verdict;

pub use checkpoint::{
    COMMITS_DIR, Checkpoint, CheckpointMetadata, CheckpointSettings, DEFAULT_RETAIN_BATCHES, MAX_CHECKPOINT_FILE_BYTES,
    MAX_METADATA_BYTES, METADATA_FILE, OFFSETS_DIR, decode_metadata, read_metadata_file,
};
pub use entries::{CommitLog, CommitMetadata, NO_OFFSET, OffsetLog, OffsetSeq, SourceOffset};
pub use error::{LogStoreError, Result};
#[cfg(feature = "failpoints")]
pub use fault::{FaultMode, FaultyFileManager};
pub use file_manager::{
    CheckpointFileManager, ContentWriter, DIR_MODE, FILE_MODE, FaultPoint, FileVersion, LocalFileManager, LogListing,
    NO_FENCE, PARTS_SUFFIX, PublishCheck, Tightened,
};
pub use holder::LockHolder;
pub use location::{ObjectStoreSettings, S3_SCHEME, file_manager_for, is_object_store_location, redacted};
pub use lock::{
    EpochFence, LOCK_FILE, LeaseSettings, LockStatus, WriterLock, decode_lock_file, encode_lock_file, read_lock_holder,
};
pub use log::{
    BodyError, Json, LogEntry, MAX_LOG_FILE_BYTES, MetadataLog, decode_entry, encode_entry, parse_batch_file_name,
};
#[cfg(all(feature = "s3", feature = "failpoints"))]
pub use object_faults::{FaultyObjectStore, HeldWrite, ObjectFault};
#[cfg(feature = "s3")]
pub use object_files::ObjectStoreFileManager;
pub use repair::{QUARANTINE_DIR, REPAIR_NOTE, RepairAction, RepairPlan, StateRollback, apply_repair, plan_repair};
pub use state::{
    CHANGES_HEADER_LEN, CHANGES_MAGIC, GRAPH_FILE, STATE_DIR, StateLink, StateShape, changes_header, split_state_file,
};
pub use verdict::{
    CheckpointShape, Inconsistency, InconsistencyKind, RecoveryPoint, Verdict, classify, inspect, inspect_with,
    repair_command,
};
