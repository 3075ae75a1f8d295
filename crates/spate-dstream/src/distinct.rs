//! Exact distinct counts: [`DistinctCount`], the set of values seen and
//! its size, to keep in any state (SQL's `COUNT(DISTINCT x)`, with or
//! without a `FILTER`), and [`DStream::distinct_count_by_key`], the number
//! of distinct values per key as an upsert stream.
//!
//! The count is exact: every distinct value is kept, so the state grows
//! with the number of distinct values, as the SQL it stands for does.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::batch::Key;
use crate::hash::KeyHashState;
use crate::stream::DStream;

/// The distinct values seen so far, and how many there are.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(bound(
    serialize = "T: Serialize + std::hash::Hash + Eq",
    deserialize = "T: Deserialize<'de> + std::hash::Hash + Eq"
))]
pub struct DistinctCount<T> {
    seen: HashSet<T, KeyHashState>,
}

impl<T> Default for DistinctCount<T> {
    fn default() -> Self {
        DistinctCount { seen: HashSet::with_hasher(KeyHashState::default()) }
    }
}

impl<T: std::hash::Hash + Eq> DistinctCount<T> {
    /// An empty count.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts `value`; returns true when it had not been seen.
    pub fn insert(&mut self, value: T) -> bool {
        self.seen.insert(value)
    }

    /// How many distinct values were seen.
    pub fn count(&self) -> u64 {
        self.seen.len() as u64
    }

    /// True when `value` was seen.
    pub fn contains(&self, value: &T) -> bool {
        self.seen.contains(value)
    }
}

impl<K: Key, V: Key> DStream<(K, V)> {
    /// The number of distinct values of each key, exactly: after each
    /// batch, `(key, count)` for every key the batch brought a new value
    /// to. Keeps every distinct value of every key (stateful: name it).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use spate_dstream::{GraphBuilder, QueueSource};
    /// # let builder = GraphBuilder::new(spate_core::Duration::from_secs(1)).checkpointing(true);
    /// // (page, visitor): how many different visitors each page had.
    /// let visits = builder.input("visits", Arc::new(QueueSource::<(String, u64)>::new()));
    /// let visitors = visits.distinct_count_by_key().name("visitors-per-page");
    /// # let _ = visitors;
    /// ```
    pub fn distinct_count_by_key(&self) -> DStream<(K, u64)> {
        self.upsert(
            "distinct_count_by_key",
            |_key, value, seen: &mut Option<DistinctCount<V>>| {
                seen.get_or_insert_with(DistinctCount::new).insert(value)
            },
            |key, seen, out| out.push((key.clone(), seen.count())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::DistinctCount;
    use crate::DStream;
    use crate::upsert::tests::run_both;

    #[test]
    fn a_distinct_count_counts_each_value_once_and_survives_serialization() {
        let mut count = DistinctCount::new();
        assert!(count.insert("a".to_string()));
        assert!(count.insert("b".to_string()));
        assert!(!count.insert("a".to_string()));
        assert_eq!(count.count(), 2);
        let bytes = serde_json::to_vec(&count).unwrap();
        let back: DistinctCount<String> = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back.count(), 2);
        assert!(back.contains(&"b".to_string()) && !back.contains(&"c".to_string()));
    }

    #[test]
    fn each_key_emits_its_count_after_a_batch_that_brought_a_new_value() {
        let rows = run_both(
            |s: &DStream<(u8, u32)>| s.distinct_count_by_key(),
            vec![
                vec![vec![(1, 5), (2, 1)], vec![(1, 5), (1, 6)]],
                vec![vec![(1, 6)], vec![(2, 1)]],
                vec![vec![(2, 3)], vec![(1, 7), (2, 3)]],
            ],
        );
        assert_eq!(rows, vec![vec![(1, 2), (2, 1)], vec![], vec![(1, 3), (2, 2)]]);
    }
}
