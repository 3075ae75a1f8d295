//! The spate engine: StreamingContext, job generation and scheduling, recovery, backpressure and progress.

#![deny(clippy::unwrap_used, clippy::expect_used)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

mod context;
pub mod demo;
mod driver;
mod error;
mod inputs;
mod pid;
mod progress;
mod rate;
mod recovery;
mod scheduler;
mod settings;
mod store;

pub use context::{OffsetsHook, PipelineBuilder, StopHandle, StreamingContext};
pub use driver::StopReport;
pub use error::RuntimeError;
pub use inputs::{ReceiverOptions, ReceiverResume};
pub use pid::{PidRateEstimator, PidSettings};
pub use progress::{BatchProgress, PhaseTimes, ProgressListener, ProgressRotation, ReceiverStatus};
pub use recovery::{RecoveryReport, RestoredOperator};
pub use settings::{BackpressureSettings, StreamingSettings, default_checkpoint_interval};
