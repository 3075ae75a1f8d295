//! Tumbling windows of processing time
//! ([`DStream::processing_time_window`]): SQL's `TUMBLE(…, PROCTIME(), size)`
//! grouped by key. A record's processing time is the time of the batch
//! that reads it, which the runtime takes from its clock (a `ManualClock`
//! in tests, so results are repeatable); a window is the batches whose
//! times fall in `(end - size, end]`, emitted by the batch at `end`.

use crate::batch::{Batch, Data, Key};
use crate::event_time::Window;
use crate::stream::DStream;
use spate_core::Duration;

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Reduces each key's values over tumbling windows of `size` of batch
    /// time (a multiple of the batch interval): at each batch time `end`
    /// that is a multiple of `size`, one `(window, key, value)` for each key
    /// with records in the batches of `(end - size, end]`, the window being
    /// `[end - size, end)` as SQL names it. `reduce` must be associative and
    /// commutative. The operator keeps the window's batches in memory
    /// (recomputed from the log after a restart, as the other windows of
    /// batch time); name it.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use spate_dstream::{GraphBuilder, QueueSource};
    /// # use spate_core::Duration;
    /// # let builder = GraphBuilder::new(Duration::from_secs(1));
    /// // (user, 1): clicks per user every 10 s of processing time.
    /// let clicks = builder.input("clicks", Arc::new(QueueSource::<(u64, u64)>::new()));
    /// let per_user = clicks.processing_time_window(Duration::from_secs(10), |a, b| a + b).name("clicks-per-user");
    /// # let _ = per_user;
    /// ```
    pub fn processing_time_window<F>(&self, size: Duration, reduce: F) -> DStream<(Window, K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        let windowed = self.reduce_by_key_and_window(reduce, size, size);
        let target = windowed.name_target;
        let mut out = windowed
            .transform(move |batch, end| {
                let window = Window { start: end - size, end };
                let parts = batch.into_partitions();
                Ok(Batch::new(
                    parts.into_iter().map(|part| part.into_iter().map(|(k, v)| (window, k, v)).collect()).collect(),
                ))
            })
            .rename_kind("processing_time_window");
        out.name_target = target;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use spate_core::{BatchId, Duration, Time};

    use crate::{GraphBuilder, QueueSource, Window};

    #[test]
    fn each_window_reduces_the_batches_read_in_it_and_comes_out_at_its_end() {
        let builder = GraphBuilder::new(Duration::from_secs(1));
        let queue = Arc::new(QueueSource::<(char, u32)>::new());
        let rows = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&rows);
        builder
            .input("in", Arc::clone(&queue))
            .processing_time_window(Duration::from_secs(2), |a, b| a + b)
            .foreach_batch(move |batch, info| {
                let mut batch: Vec<_> = batch.iter().copied().collect();
                batch.sort();
                sink.lock().unwrap().push((info.time.as_millis(), batch));
                Ok(())
            });
        let mut graph = builder.build().unwrap();
        let batches = [vec![('a', 1), ('b', 1)], vec![('a', 2)], vec![('a', 4)], vec![]];
        for (n, records) in batches.into_iter().enumerate() {
            queue.push(records);
            graph.run_batch(Time::from_millis(1000 * (n as i64 + 1)), BatchId(n as u64)).unwrap();
        }
        let window = |s: i64| Window { start: Time::from_millis(s), end: Time::from_millis(s + 2000) };
        // The batches at 1 s and 2 s make the window ending at 2 s; 3 s and 4 s the next.
        assert_eq!(
            *rows.lock().unwrap(),
            [(2000, vec![(window(0), 'a', 3), (window(0), 'b', 1)]), (4000, vec![(window(2000), 'a', 4)])]
        );
    }
}
