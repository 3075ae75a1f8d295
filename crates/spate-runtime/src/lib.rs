//! The spate engine: it runs a DStream graph batch by batch with
//! exactly-once bookkeeping, recovers it from a checkpoint directory, and
//! stops it cleanly.
//!
//! It features:
//!
//! - [`StreamingContext`]: built from the code that runs now
//!   ([`StreamingContext::get_or_create`]); when the checkpoint directory
//!   holds a checkpoint it takes the writer lock, refuses an inconsistent
//!   directory with the log store's message (naming the repair command),
//!   restores operator state by name, replays the block tracker, rebuilds
//!   state past the last snapshot, re-runs the logged-but-uncommitted batch
//!   with exactly its logged offsets, then the batches missed while down,
//!   before live batches; the [`RecoveryReport`] says what it did;
//! - the job generator: batches tick on a [`spate_core::Clock`]; `offsets/N`
//!   is durable before a batch's outputs run and `commits/N` is written only
//!   after all of them finished; operator state is checkpointed every
//!   checkpoint interval (by default the smallest multiple of the batch
//!   interval that is at least 10 s); logs, WAL segments and state past
//!   retention are purged;
//! - the job scheduler: output jobs on a worker pool, `concurrent_jobs` at
//!   once, batches committed in order;
//! - receiver inputs ([`PipelineBuilder::receiver_stream`]) under
//!   supervisors, with the receiver write-ahead log, blocks allocated by the
//!   tracker and read back by handle after a restart;
//! - backpressure: a [`PidRateEstimator`] (Spark's gains) sets the receivers'
//!   rate and caps what replayable sources plan per batch;
//! - stopping: a [`StopHandle`] stops gracefully (received data processed,
//!   committed, lock released) or at once (the next start re-runs what was
//!   not committed), also on SIGINT/SIGTERM;
//! - progress: a [`BatchProgress`] per batch to [`ProgressListener`]s, to
//!   `tracing`, and as JSON lines under `<checkpoint>/progress/` (rotated,
//!   each line with the writer's epoch, read back by [`read_progress`]);
//! - watching a job: [`StreamingSettings::with_metrics_addr`] serves
//!   `/metrics` in the Prometheus text format (every spate crate records
//!   through the `metrics` facade; the Prometheus recorder is installed
//!   once per process), and [`StreamingSettings::with_ui_addr`] serves a
//!   web page of the last batches, live charts, the inputs, the checkpoint
//!   and the recovery, every asset from the job itself;
//! - test hooks (feature `failpoints`): the environment variable
//!   `SPATE_FAILPOINTS` (off unless set) holds the driver at a named point of a batch until a file appears,
//!   or makes it panic there, so crash and signal tests need no timing;
//! - [`demo`]: the windowed word count of seeded random words.
//!
//! It is not the graph (spate-dstream), the logs (spate-logstore, spate-wal)
//! nor the command line (spate-cli).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use spate_core::{BatchId, Duration, ManualClock, Time};
//! use spate_dstream::QueueSource;
//! use spate_runtime::{StreamingContext, StreamingSettings};
//!
//! let dir = tempfile::tempdir()?;
//! let clock = ManualClock::new(Time::from_millis(10_000));
//! let settings = StreamingSettings::new(Duration::from_secs(1)).with_clock(Arc::new(clock.clone()));
//! let lines = Arc::new(QueueSource::new());
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let (input, sink) = (Arc::clone(&lines), Arc::clone(&seen));
//! let mut ctx = StreamingContext::get_or_create(dir.path(), settings, move |p| {
//!     p.input("lines", input)
//!         .map(|line: String| line.len())
//!         .foreach_batch(move |batch, info| {
//!             sink.lock().unwrap().push((info.batch_id, batch.iter().sum::<usize>()));
//!             Ok(())
//!         })
//!         .name("lengths");
//!     Ok(())
//! })?;
//! assert_eq!(ctx.recovery().map(|r| r.resumed_at), Some(BatchId(0)));
//!
//! lines.push(vec!["spate".to_string(), "stream".to_string()]);
//! ctx.start()?;
//! clock.advance(Duration::from_secs(1)); // batch 0 at 11 s
//! assert!(ctx.await_committed(BatchId(0), std::time::Duration::from_secs(30)));
//! ctx.stop_handle().stop_gracefully();
//! ctx.await_termination()?;
//! assert_eq!(*seen.lock().unwrap(), vec![(BatchId(0), 11)]);
//! assert!(dir.path().join("commits/0").exists());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod arrivals;
mod checkpoint_store;
mod context;
pub mod demo;
mod driver;
mod error;
mod failpoints;
mod http;
mod inputs;
mod process_server;
mod progress;
mod rate_controller;
mod rate_estimator;
mod recovery;
mod scheduler;
mod settings;
mod settings_file;
#[cfg(feature = "disk-store")]
mod state_spill;
mod status;
mod telemetry;

pub use context::{OffsetsHook, PipelineBuilder, StopHandle, StreamingContext};
pub use driver::StopReport;
pub use error::RuntimeError;
pub use inputs::{ReceiverResume, ReceiverSettings};
pub use process_server::{ProcessServer, ProcessStatus};
pub use progress::{
    BatchProgress, PhaseTimes, ProgressHistory, ProgressListener, ProgressRecord, ProgressRotation, ReceiverStatus,
    read_progress,
};
pub use rate_estimator::{PidRateEstimator, PidSettings};
pub use recovery::{RecoveryReport, RestoredOperator};
pub use settings::{
    BackpressureSettings, DEFAULT_FULL_SNAPSHOT_EVERY, DEFAULT_MAX_BYTES_PER_BATCH, DEFAULT_MAX_MEMORY_BYTES,
    DEFAULT_MAX_RECORDS_PER_BATCH, DEFAULT_SPILL_PER_MEMORY, StreamingSettings, default_checkpoint_interval,
};
