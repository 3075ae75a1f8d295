//! The driver-side ReceivedBlockTracker: which received blocks wait for a
//! batch and which batch got which blocks, kept in a replayable event log so
//! that a restarted driver re-runs its batches over exactly the same input.
//!
//! It features:
//!
//! - a pure, deterministic core, [`TrackerState::apply`], over three events
//!   ([`TrackerEvent`]): a block was added, the unallocated blocks went to a
//!   batch, old batches were cleaned up;
//! - [`ReceivedBlockTracker`], which writes each event to a
//!   [`spate_wal::WriteAheadLog`] before applying it (a change whose write
//!   failed never happened), commits concurrent additions as one record, and
//!   replays the log when it starts;
//! - idempotent allocation: a batch re-run after recovery gets the blocks it
//!   had, never new ones;
//! - no waiting forever: a panic while a change is logged fails every caller
//!   waiting for that commit and poisons the tracker, which then refuses
//!   every change ([`TrackerError::Poisoned`]) until a restart replays its log;
//! - versioned records: each is read by the format version in its frame
//!   ([`decode_event_record`], a pure function also used for fuzzing), and a
//!   newer or unknown version is refused by name;
//! - a [`RecoveryReport`] that names, by stream and record count, recovered
//!   blocks whose data is gone (they were never in the receiver WAL), rather
//!   than reading them as empty.
//!
//! It is not a block store: it holds block descriptions and handles, never
//! the records themselves; reading a block is the receiver side's business
//! ([`TrackedBlock::location`] says where). The event log lives in
//! `receivedBlockMetadata/` ([`event_log_dir`]) of the checkpoint directory.
//!
//! ```
//! use std::sync::Arc;
//! use spate_core::{BlockStoreResult, ManualClock, ReceivedBlockInfo, StreamBlockId, StreamId, Time};
//! use spate_tracker::ReceivedBlockTracker;
//!
//! let clock = Arc::new(ManualClock::new(Time::from_millis(1_000)));
//! let tracker = ReceivedBlockTracker::in_memory(clock);
//! let block = ReceivedBlockInfo {
//!     stream_id: StreamId(0),
//!     num_records: Some(100),
//!     metadata: None,
//!     store_result: BlockStoreResult {
//!         block_id: StreamBlockId::new(StreamId(0), 1),
//!         num_records: Some(100),
//!         wal_handle: None,
//!     },
//! };
//! assert!(tracker.add_block(block));
//! tracker.allocate_blocks_to_batch(Time::from_millis(1_000))?;
//! assert_eq!(tracker.get_blocks_of_batch_and_stream(Time::from_millis(1_000), StreamId(0)).len(), 1);
//! assert!(!tracker.has_unallocated_blocks());
//! # Ok::<(), spate_tracker::TrackerError>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod error;
mod event;
#[cfg(test)]
mod memory_wal;
mod report;
mod state;
#[cfg(test)]
mod tests;
mod tracker;

pub use error::TrackerError;
pub use event::{
    EVENT_FORMAT_VERSION, EventBatch, StreamBlocks, TrackerEvent, decode_event_record, encode_event_record,
};
pub use report::{RecoveryReport, UnrecoverableBlock, UnrecoverableCount};
pub use state::{AllocatedBlocks, BlockLocation, TrackedBlock, TrackerState};
pub use tracker::{EVENT_LOG_DIR, ReceivedBlockTracker, TrackerStats, event_log_dir, replay_event_log};
