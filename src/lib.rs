//! spate: a fault-tolerant stream-processing engine. Nothing lost, nothing
//! repeated.
//!
//! spate cuts a stream into small batches (Spark Streaming's discretized
//! streams), logs each batch's input offsets before it runs and its commit
//! after its outputs, and so restarts after a crash exactly where it stopped.
//! This package is the one dependency that brings every part, each as a
//! module:
//!
//! - [`core`]: time, batch and stream ids, the clock, the CRC-checked record frame;
//! - [`wal`]: the segmented write-ahead log with group commit;
//! - [`logstore`]: the checkpoint directory (`offsets/`, `commits/`), the
//!   writer lock, the recovery verdict and the repair of a damaged directory;
//! - [`receiver`]: receivers (generator, socket), block generation, WAL-backed storage;
//! - [`tracker`]: the received-block tracker and its event log;
//! - [`dstream`]: the DStream graph: transformations, windows, named state;
//! - [`kafka`]: the direct Kafka stream, the consumer pool, exactly-once sinks;
//! - [`files`]: the exactly-once file sink, JSON lines partitioned by
//!   event-time date and hour, on a disk or in S3;
//! - [`runtime`]: `StreamingContext`, recovery, scheduling, progress, the demo pipeline;
//! - [`app`]: an application of tasks, one per input partition, run by
//!   members that share them out through a Kafka consumer group.
//!
//! [`prelude`] brings what a job needs in one import:
//! `use spate::prelude::*;`.
//!
//! It is not the command-line tool: that is the `spate` binary of the
//! `spate-cli` package (`spate demo`, `spate run`, `spate checkpoint …`).
//! Nor does it bring the Nexmark benchmark's generator and queries: they
//! are the `spate-nexmark` package, a dependency of their own.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use spate::core::{BatchId, Duration, Time};
//! use spate::dstream::{GraphBuilder, QueueSource};
//! use spate::logstore::{Checkpoint, CheckpointSettings, CommitMetadata, OffsetSeq, Verdict};
//!
//! // A graph: words counted per batch.
//! let builder = GraphBuilder::new(Duration::from_secs(1));
//! let lines = Arc::new(QueueSource::new());
//! let counts = builder
//!     .input("lines", Arc::clone(&lines))
//!     .flat_map(|line: String| line.split(' ').map(str::to_string).collect::<Vec<_>>())
//!     .map(|word| (word, 1u64))
//!     .reduce_by_key(|a, b| a + b);
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let sink = Arc::clone(&seen);
//! counts.foreach_batch(move |batch, _| Ok(sink.lock().map_err(|e| e.to_string())?.extend(batch.iter().cloned())));
//! let mut graph = builder.build()?;
//!
//! // One batch the way the runtime runs it: offsets logged, outputs, commit.
//! let dir = tempfile::tempdir()?;
//! let checkpoint = Checkpoint::open_for_write(dir.path(), CheckpointSettings::new())?;
//! checkpoint.offsets().add(BatchId(0), &OffsetSeq::default())?;
//! lines.push(vec!["to be or not to be".to_string()]);
//! graph.run_batch(Time::from_millis(1000), BatchId(0))?;
//! checkpoint.commits().add(BatchId(0), &CommitMetadata::default())?;
//!
//! assert!(seen.lock().map_err(|e| e.to_string())?.contains(&("be".to_string(), 2)));
//! assert!(matches!(checkpoint.verdict()?, Verdict::Resume { next: BatchId(1), .. }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub use spate_app as app;
pub use spate_core as core;
pub use spate_dstream as dstream;
pub use spate_files as files;
pub use spate_kafka as kafka;
pub use spate_logstore as logstore;
pub use spate_receiver as receiver;
pub use spate_runtime as runtime;
pub use spate_tracker as tracker;
pub use spate_wal as wal;

pub mod prelude;

// The README's example is compiled and run as a doc test of this crate.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
