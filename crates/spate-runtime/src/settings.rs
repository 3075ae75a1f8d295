//! How a [`crate::StreamingContext`] runs: batch interval, checkpoint
//! interval, concurrency, retention, backpressure, memory and the caps on
//! what one batch reads, progress files, clock, and where the checkpoint,
//! its object store and the write-ahead logs are.
//!
//! This is the one settings tree of a job: its sources are not configured
//! with any of it a second time. They are told the batch interval and the
//! memory budget when the graph is built, and the limits of each batch
//! when it is planned ([`StreamingSettings::batch_limits`]). A program may
//! keep the settings in a JSON file ([`StreamingSettings::from_json`],
//! [`StreamingSettings::overlay_json`]; unknown fields are refused), and
//! the `spate` command lays its flags over such a file.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use spate_core::{Clock, Duration, SystemClock};
use spate_dstream::BatchLimits;
use spate_logstore::{LeaseSettings, ObjectStoreSettings};

use crate::error::RuntimeError;
use crate::progress::ProgressRotation;
use crate::rate_estimator::PidSettings;

/// Backpressure: the PID estimator's settings and the rates around it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackpressureSettings {
    /// When off, sources run at their configured maximum rates only.
    pub enabled: bool,
    /// Records per second allowed for the first batch, before the estimator
    /// has seen one (`None`: only the configured maximum applies, until a
    /// first batch that took longer than the interval sets the rate it
    /// processed).
    pub initial_rate: Option<f64>,
    /// The estimator's gains and floor.
    pub pid: PidSettings,
    /// An upper bound on the rate whatever the estimator says.
    pub max_rate: Option<f64>,
}

impl Default for BackpressureSettings {
    fn default() -> Self {
        BackpressureSettings { enabled: true, initial_rate: None, pid: PidSettings::default(), max_rate: None }
    }
}

/// Settings of a streaming context. Build with [`StreamingSettings::new`]
/// and the `with_*` methods.
#[derive(Clone)]
pub struct StreamingSettings {
    /// The batch interval.
    pub batch_interval: Duration,
    /// How often operator state is checkpointed; `None`: the smallest
    /// multiple of the batch interval that is at least 10 s (as Spark).
    pub checkpoint_interval: Option<Duration>,
    /// Output jobs that may run at once (default 1).
    pub concurrent_jobs: usize,
    /// Batches of `offsets/`, `commits/` and state kept behind the last
    /// commit (at least one state snapshot is always kept).
    pub retained_batches: u64,
    /// Every this many state snapshots one is whole; the others write only
    /// what changed since the previous snapshot, for the operators that
    /// can say (their large keyed windows). The first snapshot after a
    /// start or a restore is whole too. A restore reads a whole snapshot
    /// and the changes after it, so this bounds what it reads; 1: every
    /// snapshot is whole. Default [`DEFAULT_FULL_SNAPSHOT_EVERY`].
    pub full_snapshot_every: u64,
    /// Backpressure.
    pub backpressure: BackpressureSettings,
    /// Bytes of received records not yet processed that the inputs may
    /// hold together (the blocks of every receiver); a receiver that would
    /// pass it waits until a batch has read blocks out, so a source faster
    /// than the engine is slowed rather than filling memory. The default,
    /// [`DEFAULT_MAX_MEMORY_BYTES`], fits a small machine.
    ///
    /// A received stream whose blocks cannot be processed as they arrive
    /// (its reader needs the whole batch: a `join`, `transform`, `window`
    /// or `repartition` right after the input; or it has two readers) is
    /// not slowed: its blocks beyond the budget spill, encoded, to a
    /// RocksDB store in [`StreamingSettings::spill_dir`] until their batch
    /// reads them. Each keyed operator keeps up to a quarter of it of
    /// state in memory; `map_with_state` partitions beyond that move to a
    /// RocksDB store there too.
    pub max_memory_bytes: u64,
    /// Where received blocks beyond the memory budget spill (a folder of
    /// the process's own is made in it for each input, and removed when
    /// the input stops), and `map_with_state` state beyond its share of the
    /// budget (one `spate-state-*` folder, removed with the context);
    /// `None`: the system's temporary folder.
    pub spill_dir: Option<PathBuf>,
    /// Bytes the spilled blocks of every input may take on disk together.
    /// When the spill areas are full, a receiver waits until a batch has
    /// read blocks out (backpressure) and the log says so, rather than the
    /// disk filling up. `None`: [`DEFAULT_SPILL_PER_MEMORY`] times
    /// [`StreamingSettings::max_memory_bytes`] (see
    /// [`StreamingSettings::spill_limit`]).
    pub max_spill_bytes: Option<u64>,
    /// Records one batch of a replayable input (Kafka) reads at most, all
    /// of its partitions together (default
    /// [`DEFAULT_MAX_RECORDS_PER_BATCH`]); backpressure may ask for fewer.
    pub max_records_per_batch: u64,
    /// Bytes one batch of a replayable input reads at most; `None`: a
    /// quarter of [`StreamingSettings::max_memory_bytes`], up to
    /// [`DEFAULT_MAX_BYTES_PER_BATCH`], so that a batch and the copies its
    /// operators make stay within the budget. Never more than the budget.
    pub max_bytes_per_batch: Option<u64>,
    /// Where the checkpoint is (a directory or `s3://bucket/prefix`), for
    /// [`crate::StreamingContext::from_settings`]; `None`: no checkpoint.
    pub checkpoint: Option<PathBuf>,
    /// Labels added to the figures of this job's batches in `/metrics`
    /// (batches committed, late records, batch times, the last batch): a
    /// process that runs several jobs (a member of an application, one job
    /// a task) tells them apart by these, e.g. `task`, `stage`, `partition`.
    pub metric_labels: Vec<(String, String)>,
    /// Size and count of the files under `progress/`.
    pub progress_rotation: ProgressRotation,
    /// The clock batches tick on.
    pub clock: Arc<dyn Clock>,
    /// How to reach the object store of an `s3://` checkpoint (unset
    /// settings come from the AWS environment variables).
    pub object_store: ObjectStoreSettings,
    /// Where the receiver write-ahead logs and the block tracker's event log
    /// live; `None`: in the checkpoint directory. Required with an object
    /// store checkpoint when the pipeline has receivers: those logs are
    /// appended to many times a second and stay on a local disk.
    pub wal_dir: Option<PathBuf>,
    /// Where `/metrics` is served (the Prometheus text format); `None`: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// Where the web page (`/`) and its `/api/status` are served; `None`: not served.
    pub ui_addr: Option<SocketAddr>,
    /// The writer lease of an object-store checkpoint; `None`: the log
    /// store's default (15 s, renewed every 4 s). A member of an
    /// application shortens it so a dead member's partitions move soon.
    pub lease: Option<LeaseSettings>,
}

impl fmt::Debug for StreamingSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamingSettings")
            .field("batch_interval", &self.batch_interval)
            .field("checkpoint_interval", &self.checkpoint_interval)
            .field("concurrent_jobs", &self.concurrent_jobs)
            .field("retained_batches", &self.retained_batches)
            .field("full_snapshot_every", &self.full_snapshot_every)
            .field("backpressure", &self.backpressure)
            .field("max_memory_bytes", &self.max_memory_bytes)
            .field("spill_dir", &self.spill_dir)
            .field("max_spill_bytes", &self.max_spill_bytes)
            .field("max_records_per_batch", &self.max_records_per_batch)
            .field("max_bytes_per_batch", &self.max_bytes_per_batch)
            .field("checkpoint", &self.checkpoint)
            .field("metric_labels", &self.metric_labels)
            .field("progress_rotation", &self.progress_rotation)
            .field("clock", &self.clock)
            .field("object_store", &self.object_store)
            .field("wal_dir", &self.wal_dir)
            .field("metrics_addr", &self.metrics_addr)
            .field("ui_addr", &self.ui_addr)
            .field("lease", &self.lease)
            .finish()
    }
}

impl StreamingSettings {
    /// Defaults for `batch_interval` on the system clock.
    pub fn new(batch_interval: Duration) -> Self {
        StreamingSettings {
            batch_interval,
            checkpoint_interval: None,
            concurrent_jobs: 1,
            retained_batches: 100,
            full_snapshot_every: DEFAULT_FULL_SNAPSHOT_EVERY,
            backpressure: BackpressureSettings::default(),
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            spill_dir: None,
            max_spill_bytes: None,
            max_records_per_batch: DEFAULT_MAX_RECORDS_PER_BATCH,
            max_bytes_per_batch: None,
            checkpoint: None,
            metric_labels: Vec::new(),
            progress_rotation: ProgressRotation::default(),
            clock: Arc::new(SystemClock),
            object_store: ObjectStoreSettings::default(),
            wal_dir: None,
            metrics_addr: None,
            ui_addr: None,
            lease: None,
        }
    }

    /// Uses `lease` as the writer lease of an object-store checkpoint.
    pub fn with_lease(mut self, lease: LeaseSettings) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Serves `/metrics` at `addr`, in the Prometheus text format: batches,
    /// batch and scheduling times, input per source and partition,
    /// backpressure, write-ahead logs, blocks in memory, Kafka lag and
    /// transactions, the recovery verdict and the lock epoch. Bind
    /// `127.0.0.1:PORT` to keep it on this machine; port 0 takes a free port
    /// ([`crate::StreamingContext::metrics_addr`] says which). It installs
    /// spate's Prometheus recorder as the process's `metrics` recorder (once
    /// per process, shared by every context), which fails if the program
    /// installed another one.
    pub fn with_metrics_addr(mut self, addr: SocketAddr) -> Self {
        self.metrics_addr = Some(addr);
        self
    }

    /// Serves the job's web page at `addr` (`/`, with `/api/status`): the
    /// last batches as a table and as live charts, the inputs with their
    /// rates and lag, the checkpoint and this start's recovery. Every asset
    /// is served by the job itself. The same address as
    /// [`StreamingSettings::with_metrics_addr`] serves both from one server.
    pub fn with_ui_addr(mut self, addr: SocketAddr) -> Self {
        self.ui_addr = Some(addr);
        self
    }

    /// Reaches an `s3://` checkpoint with `settings`.
    pub fn with_object_store(mut self, settings: ObjectStoreSettings) -> Self {
        self.object_store = settings;
        self
    }

    /// Keeps the receiver write-ahead logs and the tracker's event log in
    /// `dir` (a local directory) instead of the checkpoint directory.
    pub fn with_wal_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.wal_dir = Some(dir.into());
        self
    }

    /// Spills received blocks beyond the memory budget under `dir` (see
    /// [`StreamingSettings::spill_dir`]).
    pub fn with_spill_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spill_dir = Some(dir.into());
        self
    }

    /// Bounds the spilled blocks of every input to `bytes` on disk (see
    /// [`StreamingSettings::max_spill_bytes`]).
    pub fn with_max_spill_bytes(mut self, bytes: u64) -> Self {
        self.max_spill_bytes = Some(bytes);
        self
    }

    /// The bytes spilled blocks may take on disk:
    /// [`StreamingSettings::max_spill_bytes`], or by default
    /// [`DEFAULT_SPILL_PER_MEMORY`] times the memory budget.
    pub fn spill_limit(&self) -> u64 {
        self.max_spill_bytes.unwrap_or_else(|| self.max_memory_bytes.saturating_mul(DEFAULT_SPILL_PER_MEMORY))
    }

    /// The folder spill areas are made in: [`StreamingSettings::spill_dir`]
    /// or the system's temporary folder.
    pub(crate) fn spill_base(&self) -> PathBuf {
        self.spill_dir.clone().unwrap_or_else(std::env::temp_dir)
    }

    /// Keeps the checkpoint at `location` (a directory or `s3://bucket/prefix`).
    pub fn with_checkpoint(mut self, location: impl Into<PathBuf>) -> Self {
        self.checkpoint = Some(location.into());
        self
    }

    /// Holds received blocks and batches within `bytes` of memory (see
    /// [`StreamingSettings::max_memory_bytes`]).
    pub fn with_max_memory_bytes(mut self, bytes: u64) -> Self {
        self.max_memory_bytes = bytes;
        self
    }

    /// Caps every batch of a replayable input at `records` records.
    pub fn with_max_records_per_batch(mut self, records: u64) -> Self {
        self.max_records_per_batch = records;
        self
    }

    /// Caps every batch of a replayable input at `bytes` bytes.
    pub fn with_max_bytes_per_batch(mut self, bytes: u64) -> Self {
        self.max_bytes_per_batch = Some(bytes);
        self
    }

    /// The bytes one batch of a replayable input reads at most (see
    /// [`StreamingSettings::max_bytes_per_batch`]).
    pub fn batch_bytes(&self) -> u64 {
        self.max_bytes_per_batch.unwrap_or_else(|| DEFAULT_MAX_BYTES_PER_BATCH.min(self.max_memory_bytes / 4)).max(1)
    }

    /// The limits one batch of a replayable input plans within, given
    /// `backpressure`, the records backpressure allows the input (`None`:
    /// no limit).
    pub fn batch_limits(&self, backpressure: Option<u64>) -> BatchLimits {
        let records = backpressure.map_or(self.max_records_per_batch, |r| r.min(self.max_records_per_batch));
        BatchLimits::new(Some(records), Some(self.batch_bytes()))
    }

    /// Adds the label `name`=`value` to the figures of this job's batches
    /// (see [`StreamingSettings::metric_labels`]).
    pub fn with_metric_label(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.metric_labels.push((name.into(), value.into()));
        self
    }

    /// Runs batches on `clock` (a `ManualClock` in tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Checkpoints state every `interval` (a multiple of the batch interval).
    pub fn with_checkpoint_interval(mut self, interval: Duration) -> Self {
        self.checkpoint_interval = Some(interval);
        self
    }

    /// Lets `n` output jobs run at once.
    pub fn with_concurrent_jobs(mut self, n: usize) -> Self {
        self.concurrent_jobs = n;
        self
    }

    /// Keeps `n` batches of logs and state behind the last commit.
    pub fn with_retained_batches(mut self, n: u64) -> Self {
        self.retained_batches = n;
        self
    }

    /// Makes every `n`-th state snapshot whole, the others changes only
    /// (see [`StreamingSettings::full_snapshot_every`]); 1: always whole.
    pub fn with_full_snapshot_every(mut self, n: u64) -> Self {
        self.full_snapshot_every = n;
        self
    }

    /// Sets the backpressure settings.
    pub fn with_backpressure(mut self, backpressure: BackpressureSettings) -> Self {
        self.backpressure = backpressure;
        self
    }

    /// Sets how progress files rotate.
    pub fn with_progress_rotation(mut self, rotation: ProgressRotation) -> Self {
        self.progress_rotation = rotation;
        self
    }

    /// The checkpoint interval in force.
    pub fn effective_checkpoint_interval(&self) -> Duration {
        self.checkpoint_interval.unwrap_or_else(|| default_checkpoint_interval(self.batch_interval))
    }

    /// Checks every setting; the context calls it before it starts.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let invalid =
            |setting: &str, reason: String| Err(RuntimeError::InvalidSetting { setting: setting.to_string(), reason });
        if self.batch_interval == Duration::ZERO {
            return invalid("batch_interval", "must be positive".into());
        }
        let checkpoint = self.effective_checkpoint_interval();
        if !checkpoint.is_multiple_of(self.batch_interval) {
            return invalid(
                "checkpoint_interval",
                format!("{checkpoint} is not a multiple of the batch interval {}", self.batch_interval),
            );
        }
        if self.concurrent_jobs == 0 {
            return invalid("concurrent_jobs", "must be at least 1".into());
        }
        if self.full_snapshot_every == 0 {
            return invalid("full_snapshot_every", "must be at least 1 (1: every state snapshot is whole)".into());
        }
        if self.max_memory_bytes == 0 {
            return invalid("max_memory_bytes", "must be positive".into());
        }
        if self.max_records_per_batch == 0 {
            return invalid("max_records_per_batch", "must be positive".into());
        }
        match self.max_bytes_per_batch {
            Some(0) => return invalid("max_bytes_per_batch", "must be positive".into()),
            Some(bytes) if bytes > self.max_memory_bytes => {
                return invalid(
                    "max_bytes_per_batch",
                    format!(
                        "{bytes} is more than the memory budget ({}): one batch must fit in it",
                        self.max_memory_bytes
                    ),
                );
            }
            _ => {}
        }
        if self.max_spill_bytes == Some(0) {
            return invalid(
                "max_spill_bytes",
                "must be positive (a block that cannot spill could never be stored)".into(),
            );
        }
        if let Some(rate) = self.backpressure.initial_rate.filter(|r| r.is_nan() || *r <= 0.0) {
            return invalid("backpressure.initial_rate", format!("{rate} is not positive"));
        }
        Ok(())
    }

    /// How many batches make one checkpoint interval.
    #[cfg(test)]
    pub(crate) fn batches_per_checkpoint(&self) -> u64 {
        self.effective_checkpoint_interval().div_duration(self.batch_interval).max(1)
    }
}

/// How many state snapshots make one whole one unless set
/// ([`StreamingSettings::full_snapshot_every`]): a restore then reads a
/// whole snapshot and at most 9 files of changes, and a job whose state
/// changes little a checkpoint writes about a tenth as much.
pub const DEFAULT_FULL_SNAPSHOT_EVERY: u64 = 10;

/// The records a batch of a replayable input reads at most unless set
/// ([`StreamingSettings::max_records_per_batch`]): about half a second of
/// what the Kafka direct stream reads on a 2-core machine (1.1 M records/s
/// measured), so a backlog is worked off in batches that are read well
/// within a 1 s interval and leave time to process them.
pub const DEFAULT_MAX_RECORDS_PER_BATCH: u64 = 500_000;

/// The most bytes a batch of a replayable input reads by default: 64 MiB,
/// or a quarter of the memory budget when that is less (see
/// [`StreamingSettings::max_bytes_per_batch`]). A batch's records are
/// copied by the operators that follow (a flat map, a shuffle, a window's
/// state), so the input should be a small part of the budget.
pub const DEFAULT_MAX_BYTES_PER_BATCH: u64 = 64 << 20;

/// The memory budget of [`StreamingSettings::max_memory_bytes`] unless set:
/// 256 MiB of received blocks, which with the batch being processed and the
/// engine's own memory keeps a job well inside a machine of 1 GiB.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 256 << 20;

/// The spill limit unless set, as a multiple of the memory budget: 4 GiB
/// of blocks on disk under the default budget, many batches' worth for a
/// stream whose whole-batch reader fell behind, yet not a disk's worth.
pub const DEFAULT_SPILL_PER_MEMORY: u64 = 16;

/// The smallest multiple of `batch_interval` that is at least 10 seconds.
pub fn default_checkpoint_interval(batch_interval: Duration) -> Duration {
    let ten_seconds = Duration::from_secs(10).as_millis();
    let batch = batch_interval.as_millis().max(1);
    Duration::from_millis(ten_seconds.div_ceil(batch) * batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_checkpoint_interval_is_the_first_multiple_past_ten_seconds() {
        assert_eq!(default_checkpoint_interval(Duration::from_secs(1)), Duration::from_secs(10));
        assert_eq!(default_checkpoint_interval(Duration::from_secs(3)), Duration::from_secs(12));
        assert_eq!(default_checkpoint_interval(Duration::from_millis(300)), Duration::from_millis(10_200));
        assert_eq!(default_checkpoint_interval(Duration::from_secs(15)), Duration::from_secs(15));
    }

    #[test]
    fn validation_refuses_bad_intervals() {
        let settings = StreamingSettings::new(Duration::from_secs(2));
        assert!(settings.validate().is_ok());
        assert_eq!(settings.batches_per_checkpoint(), 5);
        assert!(settings.clone().with_checkpoint_interval(Duration::from_secs(3)).validate().is_err());
        assert!(StreamingSettings::new(Duration::ZERO).validate().is_err());
        assert!(settings.clone().with_concurrent_jobs(0).validate().is_err());
        let refused = settings.with_full_snapshot_every(0).validate().unwrap_err();
        assert!(refused.to_string().contains("full_snapshot_every"), "{refused}");
    }

    #[test]
    fn spilled_blocks_are_bounded_by_default_by_a_multiple_of_the_memory_budget() {
        let mut settings = StreamingSettings::new(Duration::from_secs(1));
        assert_eq!(settings.spill_limit(), DEFAULT_MAX_MEMORY_BYTES * DEFAULT_SPILL_PER_MEMORY);
        settings.max_memory_bytes = 64 << 20;
        assert_eq!(settings.spill_limit(), 1 << 30);
        assert_eq!(settings.clone().with_max_spill_bytes(5 << 20).spill_limit(), 5 << 20);
        let refused = settings.with_max_spill_bytes(0).validate().unwrap_err();
        assert!(refused.to_string().contains("max_spill_bytes"), "{refused}");
    }
}
