//! How a [`crate::FileWriteAheadLog`] is configured: rolling, syncing,
//! bounds, recovery mode, the writer fence, the clock and the test hook.

use std::sync::Arc;

use spate_core::{Clock, Duration, SystemClock, Unfenced, WriterFence};

#[cfg(feature = "failpoints")]
use crate::faults::FaultInjection;

/// When the log calls `fdatasync` on the active segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncPolicy {
    /// Every write returns only after an `fdatasync` that covers it.
    /// Concurrent writers share one sync (group commit). The default.
    #[default]
    EveryWrite,
    /// A write syncs when at least this long (on the log's clock) has passed
    /// since the last sync; writes in between are acknowledged once they are
    /// in the operating system's page cache. Rolling to a new segment,
    /// [`crate::FileWriteAheadLog::sync`] and `close` sync too. A crash can
    /// lose up to one interval of acknowledged records.
    Interval(Duration),
    /// Never call `fdatasync`, not even on close. **Unsafe**: a machine crash
    /// can lose any acknowledged record and leave torn records in any
    /// segment. Only for tests and data that can be rebuilt.
    Never,
}

/// The options of a [`crate::FileWriteAheadLog`].
///
/// Start from [`WalSettings::default`] and change what you need with the
/// `with_*` methods.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WalSettings {
    /// A new segment starts when a record's time reaches the end of the
    /// active one; each segment covers `[start, start + rolling_interval)`.
    /// Default: 60 s.
    pub rolling_interval: Duration,
    /// When to `fdatasync`. Default: [`SyncPolicy::EveryWrite`].
    pub sync_policy: SyncPolicy,
    /// The largest record accepted, in bytes. Readers refuse (and never
    /// allocate for) a length above it. Default: 64 MiB.
    pub max_record_size: u32,
    /// Close the segment file after every batch of writes and reopen it for
    /// the next, for stores where keeping a file open is costly. Default: off.
    pub close_file_after_write: bool,
    /// Append large writes with direct I/O (`O_DIRECT`), bypassing the page
    /// cache: for logs of large records (received blocks) this saves most
    /// of the processor time an append costs. A record of 256 KiB or more
    /// is preceded by padding (under 8 KiB, skipped by readers) that puts
    /// its bytes at the same offset within a page in the file as in the
    /// caller's buffer, so its pages are written from that buffer without
    /// a copy; a large append ends with padding to a page boundary. Linux
    /// only; elsewhere, or on a file system that refuses direct I/O,
    /// appends are buffered. Default: off.
    pub direct_io: bool,
    /// Keep up to this many files of cleaned segments, zeroed, and start
    /// new segments in them rather than in new files: rewriting blocks a
    /// file owns is much faster than allocating new ones on thin-provisioned
    /// disks and file systems mounted with `discard`. Files the file system
    /// cannot zero in place (`FALLOC_FL_ZERO_RANGE`, Linux) are deleted as
    /// with 0. Default: 0.
    pub recycled_segments: usize,
    /// Skip damaged records (with a warning) instead of failing with
    /// [`crate::WalError::Corrupt`]. Skipped records are lost. Default: off.
    pub salvage: bool,
    /// The writer fence: checked before every append and every change to
    /// the directory, and its epoch goes into the names of the segments
    /// (and spares) this writer creates; see the crate documentation.
    /// Default: [`Unfenced`] (epoch 0, Spark's segment names, no seal).
    pub fence: Arc<dyn WriterFence>,
    /// The clock behind [`SyncPolicy::Interval`]. Default: [`SystemClock`].
    pub clock: Arc<dyn Clock>,
    /// A test hook that counts and fails file operations (feature
    /// `failpoints`). Default: none.
    #[cfg(feature = "failpoints")]
    pub fault_injection: Option<FaultInjection>,
}

/// The default [`WalSettings::max_record_size`]: 64 MiB.
pub const DEFAULT_MAX_RECORD_SIZE: u32 = 64 << 20;

impl Default for WalSettings {
    fn default() -> Self {
        WalSettings {
            rolling_interval: Duration::from_secs(60),
            sync_policy: SyncPolicy::EveryWrite,
            max_record_size: DEFAULT_MAX_RECORD_SIZE,
            close_file_after_write: false,
            direct_io: false,
            recycled_segments: 0,
            salvage: false,
            fence: Arc::new(Unfenced),
            clock: Arc::new(SystemClock),
            #[cfg(feature = "failpoints")]
            fault_injection: None,
        }
    }
}

impl WalSettings {
    /// Sets [`WalSettings::rolling_interval`] (a zero interval is taken as 1 ms).
    pub fn with_rolling_interval(mut self, interval: Duration) -> Self {
        self.rolling_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Sets [`WalSettings::sync_policy`].
    pub fn with_sync_policy(mut self, policy: SyncPolicy) -> Self {
        self.sync_policy = policy;
        self
    }

    /// Sets [`WalSettings::max_record_size`].
    pub fn with_max_record_size(mut self, bytes: u32) -> Self {
        self.max_record_size = bytes;
        self
    }

    /// Sets [`WalSettings::close_file_after_write`].
    pub fn with_close_file_after_write(mut self, close: bool) -> Self {
        self.close_file_after_write = close;
        self
    }

    /// Sets [`WalSettings::direct_io`].
    pub fn with_direct_io(mut self, direct: bool) -> Self {
        self.direct_io = direct;
        self
    }

    /// Sets [`WalSettings::recycled_segments`].
    pub fn with_recycled_segments(mut self, spares: usize) -> Self {
        self.recycled_segments = spares;
        self
    }

    /// Sets [`WalSettings::salvage`].
    pub fn with_salvage(mut self, salvage: bool) -> Self {
        self.salvage = salvage;
        self
    }

    /// Sets [`WalSettings::fence`].
    pub fn with_fence(mut self, fence: Arc<dyn WriterFence>) -> Self {
        self.fence = fence;
        self
    }

    /// Sets [`WalSettings::clock`].
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets [`WalSettings::fault_injection`].
    #[cfg(feature = "failpoints")]
    pub fn with_fault_injection(mut self, hook: FaultInjection) -> Self {
        self.fault_injection = Some(hook);
        self
    }
}
