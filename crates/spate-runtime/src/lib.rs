//! The spate engine: StreamingContext, job generation and scheduling, recovery, backpressure and progress.
