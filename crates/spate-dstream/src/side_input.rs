//! A join with a bounded side input ([`DStream::join_side_input`]): each
//! record looks its key up in a table loaded once, at start (SQL's lookup
//! join, `JOIN table FOR SYSTEM_TIME AS OF … ON key`, with a table that does
//! not change while the stream runs). Per record and partition-local: no
//! shuffle, no state; the table is shared by every partition.

use std::sync::Arc;

use crate::batch::{Data, Key};
use crate::hash::{KeyHashMap, map_with_capacity};
use crate::stream::DStream;

/// A bounded table of `(key, value)` rows, loaded before the stream
/// starts. Cheap to clone (the rows are shared).
#[derive(Clone, Debug)]
pub struct SideInput<K, W> {
    rows: Arc<KeyHashMap<K, W>>,
}

impl<K: Key, W: Data> SideInput<K, W> {
    /// A table of `rows`; of two rows with one key, the later stands.
    pub fn from_rows(rows: impl IntoIterator<Item = (K, W)>) -> Self {
        let rows = rows.into_iter();
        let mut map = map_with_capacity(rows.size_hint().0);
        map.extend(rows);
        SideInput { rows: Arc::new(map) }
    }

    /// The value of `key`, if the table has it.
    pub fn get(&self, key: &K) -> Option<&W> {
        self.rows.get(key)
    }

    /// How many rows the table has.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True when the table has no row.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl<T: Data> DStream<T> {
    /// Joins every record with the row of `side` whose key is `key(record)`:
    /// `join(record, value)` for a record whose key the table has; a record
    /// without a row (or whose `key` is `None`) is dropped, as in an inner
    /// join.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use spate_dstream::{GraphBuilder, QueueSource, SideInput};
    /// # let builder = GraphBuilder::new(spate_core::Duration::from_secs(1));
    /// let names = SideInput::from_rows([(1u32, "one".to_string()), (2, "two".to_string())]);
    /// let numbers = builder.input("numbers", Arc::new(QueueSource::<u32>::new()));
    /// let named = numbers.join_side_input(&names, |n| Some(*n), |n, name: &String| (n, name.clone()));
    /// # let _ = named;
    /// ```
    pub fn join_side_input<K, W, U, KF, JF>(&self, side: &SideInput<K, W>, key: KF, join: JF) -> DStream<U>
    where
        K: Key,
        W: Data,
        U: Data,
        KF: Fn(&T) -> Option<K> + Send + Sync + 'static,
        JF: Fn(T, &W) -> U + Send + Sync + 'static,
    {
        let side = side.clone();
        self.flat_map(move |record: T| {
            let value = key(&record).and_then(|k| side.get(&k))?;
            Some(join(record, value))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use spate_core::{BatchId, Duration, Time};

    use super::SideInput;
    use crate::{GraphBuilder, QueueSource};

    #[test]
    fn records_with_a_row_are_joined_and_the_others_dropped() {
        let side = SideInput::from_rows([(0u32, 'a'), (1, 'b'), (1, 'c')]);
        assert_eq!((side.len(), side.get(&1)), (2, Some(&'c')));
        let builder = GraphBuilder::new(Duration::from_secs(1));
        let queue = Arc::new(QueueSource::<u32>::new());
        let rows = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&rows);
        builder
            .input("in", Arc::clone(&queue))
            .join_side_input(&side, |n| (*n != 10).then_some(n % 10), |n, c: &char| (n, *c))
            .foreach_batch(move |batch, _| {
                sink.lock().unwrap().extend(batch.iter().copied());
                Ok(())
            });
        let mut graph = builder.build().unwrap();
        queue.push_partitions(vec![vec![0, 11, 2], vec![10, 21]]);
        graph.run_batch(Time::from_millis(1000), BatchId(0)).unwrap();
        assert_eq!(*rows.lock().unwrap(), [(0, 'a'), (11, 'c'), (21, 'c')]);
    }
}
