//! What a job needs, in one import: `use spate::prelude::*;`.
//!
//! The types a typical job names: the context that runs it and its
//! settings, the graph and its streams, inputs and sources, time and batch
//! ids, the checkpoint's options, the Kafka direct stream and sinks, the
//! file sink, event-time windows and watermarks, and an application's tasks
//! and members. Anything else is one path away, under the module of its crate
//! (`spate::runtime::…`, `spate::kafka::…`).
//!
//! ```
//! use spate::prelude::*;
//!
//! let settings = StreamingSettings::new(Duration::from_secs(1));
//! let context = StreamingContext::new(settings, |pipeline: &mut PipelineBuilder| {
//!     let lines = std::sync::Arc::new(QueueSource::<String>::new());
//!     pipeline.input("lines", lines).map(|line| line.len()).foreach_batch(|_, _| Ok(()));
//!     Ok(())
//! })?;
//! assert!(context.recovery().is_none());
//! # Ok::<(), RuntimeError>(())
//! ```

pub use spate_app::{AppError, Emit, Member, MemberSettings, TaskBuilder, TaskId, Topology};
pub use spate_core::{BatchId, Duration, Time};
pub use spate_dstream::{
    BatchLimits, BoxError, DStream, Data, EventWindows, GraphBuilder, InputSource, QueueSource, SourceContext, State,
    Watermarks, Window, WindowResult,
};
pub use spate_files::{FileSink, FileSinkSettings, Partitioning, WriteFiles};
pub use spate_kafka::{
    DirectKafkaSettings, DirectKafkaStream, KafkaRecord, KafkaSink, OffsetCommit, OffsetRanges, OutputRecord,
    StartingOffsets, TopicPartition, TransactionalKafkaSink,
};
pub use spate_logstore::CheckpointSettings;
pub use spate_runtime::{
    BackpressureSettings, OffsetsHook, PipelineBuilder, ProgressListener, ReceiverSettings, RuntimeError, StopHandle,
    StopReport, StreamingContext, StreamingSettings,
};
