//! The sink as an output of a stream: `stream.write_files(sink)`.

use std::sync::Arc;

use spate_dstream::{DStream, Data, Output};

use crate::sink::FileSink;

/// Writing a stream's batches through a [`FileSink`].
pub trait WriteFiles<T> {
    /// Registers an output that writes every batch of the stream through
    /// `sink`, before the batch commits. Name it (`.name("…")`) so that its
    /// errors say which output failed.
    fn write_files(&self, sink: FileSink<T>) -> Output;
}

impl<T: Data> WriteFiles<T> for DStream<T> {
    fn write_files(&self, sink: FileSink<T>) -> Output {
        let sink = Arc::new(sink);
        self.foreach_batch(move |batch, info| {
            sink.write_batch(batch.iter(), info)?;
            Ok(())
        })
    }
}
