//! The smallest job: the words of one line counted in one batch, on a
//! checkpoint in a temporary folder, then a graceful stop. No broker needed.
//!
//! ```sh
//! cargo run --example hello
//! ```

use std::sync::Arc;
use std::time::Duration as Wait;

use spate::core::{BatchId, Duration};
use spate::dstream::QueueSource;
use spate::runtime::{StreamingContext, StreamingSettings};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lines = Arc::new(QueueSource::new());
    lines.push(vec!["hello spate hello stream".to_string()]);
    let checkpoint = tempfile::tempdir()?;
    let settings = StreamingSettings::new(Duration::from_millis(200));
    let mut ctx = StreamingContext::get_or_create(checkpoint.path(), settings, move |p| {
        p.input("lines", lines)
            .flat_map(|line: String| line.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .map(|word| (word, 1u64))
            .reduce_by_key(|a, b| a + b)
            .foreach_batch(|counts, info| {
                println!("batch {}: {:?}", info.batch_id, counts.iter().collect::<Vec<_>>());
                Ok(())
            });
        Ok(())
    })?;
    ctx.start()?;
    let committed = ctx.await_committed(BatchId(0), Wait::from_secs(30));
    ctx.stop_handle().stop_gracefully();
    ctx.await_termination()?;
    if committed { Ok(()) } else { Err("batch 0 did not commit within 30 s".into()) }
}
