//! What recovery found: how much of the event log was replayed and which
//! recovered blocks cannot be read back.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use spate_core::{StreamBlockId, StreamId, Time};

use crate::error::TrackerError;
use crate::state::{BlockLocation, TrackerState};

/// A recovered block whose data is gone: it was held only in the memory of
/// the process that crashed, never in the receiver write-ahead log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnrecoverableBlock {
    /// The block's stream.
    pub stream_id: StreamId,
    /// The block.
    pub block_id: StreamBlockId,
    /// Records in the block, when the receiver reported them.
    pub num_records: Option<u64>,
    /// The batch the block is allocated to, or `None` while unallocated.
    pub batch: Option<Time>,
}

/// The unrecoverable blocks of one stream, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnrecoverableCount {
    /// Blocks lost.
    pub blocks: u64,
    /// Records lost, over the blocks whose record count is known.
    pub records: u64,
    /// Blocks lost whose record count the receiver did not report.
    pub blocks_without_count: u64,
}

/// The outcome of replaying the event log when a tracker starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The event log replayed (`None` for a tracker without a log).
    pub log: Option<PathBuf>,
    /// Log records read.
    pub records: u64,
    /// Events applied.
    pub events: u64,
    /// Blocks recovered that wait for a batch.
    pub unallocated_blocks: u64,
    /// Batches recovered with their allocations (not yet cleaned up).
    pub allocated_batches: u64,
    /// The last allocated batch time recovered: batches at or before it keep
    /// their blocks when re-run.
    pub last_allocated: Option<Time>,
    /// Recovered blocks whose data cannot be read back.
    pub unrecoverable: Vec<UnrecoverableBlock>,
}

impl RecoveryReport {
    /// The report of the state rebuilt from `records` records holding `events` events.
    pub(crate) fn of_state(state: &TrackerState, log: Option<PathBuf>, records: u64, events: u64) -> Self {
        let unallocated =
            state.all_unallocated_blocks().filter(|b| b.location() == BlockLocation::Lost).map(|b| (b, None));
        let allocated = state.allocated_batches().flat_map(|(time, streams)| {
            streams.values().flatten().filter(|b| b.location() == BlockLocation::Lost).map(move |b| (b, Some(time)))
        });
        let unrecoverable = unallocated
            .chain(allocated)
            .map(|(block, batch)| UnrecoverableBlock {
                stream_id: block.info().stream_id,
                block_id: block.block_id(),
                num_records: block.info().num_records,
                batch,
            })
            .collect();
        RecoveryReport {
            log,
            records,
            events,
            unallocated_blocks: state.all_unallocated_blocks().count() as u64,
            allocated_batches: state.allocated_batches().count() as u64,
            last_allocated: state.last_allocated_batch_time(),
            unrecoverable,
        }
    }

    /// True when every recovered block can be read back.
    pub fn is_complete(&self) -> bool {
        self.unrecoverable.is_empty()
    }

    /// The unrecoverable blocks summed by stream.
    pub fn unrecoverable_by_stream(&self) -> BTreeMap<StreamId, UnrecoverableCount> {
        let mut counts: BTreeMap<StreamId, UnrecoverableCount> = BTreeMap::new();
        for block in &self.unrecoverable {
            let count = counts.entry(block.stream_id).or_default();
            count.blocks += 1;
            match block.num_records {
                Some(n) => count.records += n,
                None => count.blocks_without_count += 1,
            }
        }
        counts
    }

    /// `Ok` when every recovered block can be read back, otherwise
    /// [`TrackerError::UnrecoverableData`] with this report's summary, for a
    /// runtime that must not compute results over lost input.
    pub fn ensure_recoverable(&self) -> Result<(), TrackerError> {
        if self.is_complete() {
            return Ok(());
        }
        Err(TrackerError::UnrecoverableData { summary: self.to_string() })
    }
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let log = self.log.as_ref().map_or_else(|| "no event log".to_string(), |p| p.display().to_string());
        write!(
            f,
            "tracker recovery from {log}: {} event(s) in {} record(s); {} unallocated block(s), {} allocated batch(es)",
            self.events, self.records, self.unallocated_blocks, self.allocated_batches
        )?;
        if self.is_complete() {
            return Ok(());
        }
        write!(f, "; data that cannot be recovered (blocks never written to the receiver WAL):")?;
        for (stream, count) in self.unrecoverable_by_stream() {
            write!(f, " stream {stream}: {} block(s), {} record(s)", count.blocks, count.records)?;
            if count.blocks_without_count > 0 {
                write!(f, " plus {} block(s) of unknown size", count.blocks_without_count)?;
            }
            write!(f, ";")?;
        }
        write!(f, " enable the receiver write-ahead log to make received data survive a restart")
    }
}
