//! The DStream graph: transformations, incremental windows and named,
//! upgradeable state.
//!
//! A pipeline is a graph built from code: input streams (each reading an
//! [`InputSource`]), transformations and outputs. The runtime drives the
//! graph one batch time at a time; each batch is a partitioned, in-memory
//! [`Batch`] processed partition-parallel on a worker pool as wide as the
//! machine, with hash partitioning for shuffles.
//!
//! It features:
//!
//! - the transformations of Spark's DStreams (`map`, `flat_map`, `filter`,
//!   `reduce_by_key`, `join`, `window`, `update_state_by_key`,
//!   `map_with_state`, …), and each batch's top N (`top_n`, Spark's
//!   `rdd.top`), which a window or `update_state_by_key` read by it alone
//!   picks as it lists its result;
//! - incremental windows: with an inverse function a slide costs the batches
//!   that enter and leave; without one, a two-stack queue of panes makes a
//!   slide cost the same whatever the window's length;
//! - aggregation per key without a window, as an upsert stream of the keys
//!   each batch changed (`aggregate_by_key`), and on it the latest record
//!   per key (`dedup_latest_by_key`), the top N per key (`top_n_by_key`)
//!   and exact distinct counts (`distinct_count_by_key`, [`DistinctCount`]);
//! - tumbling windows of processing time (`processing_time_window`), a
//!   join with a bounded side input ([`SideInput`], `join_side_input`) and
//!   SQL's scalar string and time functions ([`functions`]);
//! - event time ([`event_time`]): per-partition watermarks, tumbling,
//!   sliding and session windows with allowed lateness and a late output,
//!   and keyed timers, with results that do not depend on batching;
//! - validation when the graph is built (window multiples, checkpointing for
//!   stateful operators, streams nobody consumes), each error naming its operator;
//! - checkpoints that hold data, never code: a [`GraphDescriptor`] and each
//!   operator's state, matched by stable name on restart, so an upgraded
//!   graph resumes, and an incompatible change is an error that says what changed.
//!
//! It is not the runtime: it neither schedules batches, writes the offset
//! log nor stores checkpoints; `spate-runtime` does that through [`Graph`].
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use spate_core::{BatchId, Duration, Time};
//! use spate_dstream::{GraphBuilder, QueueSource};
//!
//! let builder = GraphBuilder::new(Duration::from_secs(1));
//! let lines = Arc::new(QueueSource::new());
//! let counts = builder
//!     .input("lines", Arc::clone(&lines))
//!     .flat_map(|line: String| line.split(' ').map(str::to_string).collect::<Vec<_>>())
//!     .map(|word| (word, 1u64))
//!     .reduce_by_key(|a, b| a + b);
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let sink = Arc::clone(&seen);
//! counts.foreach_batch(move |batch, _info| {
//!     sink.lock().unwrap().extend(batch.iter().cloned());
//!     Ok(())
//! });
//! let mut graph = builder.build()?;
//!
//! lines.push(vec!["to be or not to be".to_string()]);
//! graph.run_batch(Time::from_millis(1000), BatchId(0))?;
//! let mut result = seen.lock().unwrap().clone();
//! result.sort();
//! assert_eq!(result[0], ("be".to_string(), 2));
//! # Ok::<(), spate_dstream::DStreamError>(())
//! ```

//! Checkpoints and upgrades: the runtime stores the descriptor (serde) and
//! the state frames after a batch; a new build of the code restores them by
//! operator name and goes on with the next batch.
//!
//! ```
//! use std::sync::Arc;
//! use spate_core::{BatchId, Duration, Time};
//! use spate_dstream::{GraphBuilder, QueueSource, RestorePolicy};
//!
//! let build = |window_secs: u64| {
//!     let builder = GraphBuilder::new(Duration::from_secs(1)).checkpointing(true);
//!     let queue = Arc::new(QueueSource::<(String, u64)>::new());
//!     builder
//!         .input("clicks", Arc::clone(&queue))
//!         .reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, Duration::from_secs(window_secs), Duration::from_secs(1))
//!         .name("clicks-per-page")
//!         .foreach_batch(|_batch, _info| Ok(()));
//!     (builder.build(), queue)
//! };
//! let (graph, queue) = build(10);
//! let mut graph = graph?;
//! queue.push(vec![("/home".to_string(), 1)]);
//! graph.run_batch(Time::from_millis(1000), BatchId(0))?;
//! let (descriptor, state) = (graph.descriptor(), graph.snapshot_state()?);
//!
//! // Same operator names and windows: the state resumes.
//! let mut upgraded = build(10).0?;
//! let report = upgraded.restore(&descriptor, state.clone(), &RestorePolicy::strict())?;
//! assert_eq!(report.resumed, ["clicks-per-page"]);
//! upgraded.resume_after(Time::from_millis(1000));
//!
//! // A changed window cannot reuse the state, and the error says why.
//! let err = build(20).0?.restore(&descriptor, state, &RestorePolicy::strict()).unwrap_err();
//! assert!(err.to_string().contains("window changed from 10000 ms to 20000 ms"));
//! # Ok::<(), spate_dstream::DStreamError>(())
//! ```

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod arrival;
mod batch;
mod combined;
mod dedup;
mod descriptor;
mod distinct;
mod error;
pub mod event_time;
pub mod functions;
mod graph;
mod hash;
mod inverse_window;
mod keyed;
mod node;
mod output;
mod pair;
mod pane_window;
mod pool;
mod processing_time;
mod runs;
mod side_input;
mod source;
mod spill;
mod spilled;
mod state;
mod stream;
mod top_n;
mod upsert;
mod window;
mod window_slices;

pub use arrival::{ArrivalStage, ProcessedBlock};
pub use batch::{Batch, Data, Key};
pub use descriptor::{
    DESCRIPTOR_FORMAT_VERSION, GraphDescriptor, OperatorDescriptor, RestorePolicy, RestoreReport, StateFile,
    StateSnapshot, StateWriter,
};
pub use distinct::DistinctCount;
pub use error::{BoxError, DStreamError, GraphProblem};
pub use event_time::{
    DEFAULT_MAX_FUTURE, EventTimeProcessed, EventTimeWindowed, EventWindows, MAX_WINDOWS_PER_RECORD, ProgressMark,
    Timed, TimedState, Watermarks, Window, WindowResult, WithLate,
};
pub use graph::{BatchInfo, Graph, GraphBuilder, InputInfo, Job, Released};
pub use hash::{FxHasher, KeyHashMap, KeyHashState, fx_hash, partition_of};
pub use node::PlannedOffsets;
pub use output::Output;
pub use side_input::SideInput;
pub use source::{BatchLimits, FedSource, InputSource, QueueSource, SourceContext};
pub use spate_core::{InPlace, Views};
pub use spill::{MemorySpillStore, SpillBlobs, SpillError, SpillStore, SpillTable, SpillWrites, StateSpill};
pub use state::{MapWithStateStream, State};
pub use stream::DStream;

#[cfg(test)]
mod tests {
    /// The runtime moves the graph and its jobs to worker threads.
    #[test]
    fn graph_and_jobs_can_move_between_threads() {
        fn is_send<T: Send>() {}
        is_send::<crate::Graph>();
        is_send::<crate::Job>();
        is_send::<crate::GraphDescriptor>();
    }
}
