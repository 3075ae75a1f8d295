//! Deduplication keeping the latest record per key
//! ([`DStream::dedup_latest_by_key`]): SQL's `ROW_NUMBER() OVER (PARTITION
//! BY key ORDER BY time DESC) = 1` over an unbounded table, as an upsert
//! stream of each key's latest record.

use std::cmp::Ordering;

use crate::batch::{Data, Key};
use crate::stream::DStream;

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Keeps, per key, the greatest record by `compare` (the latest, when
    /// it compares times) and emits `(key, record)` after each batch in
    /// which a key's greatest record changed. A record equal to the one
    /// kept by `compare` does not replace it, so with a total order on the
    /// records what is emitted does not depend on their order within a
    /// batch. Keeps one record per key for ever (stateful: name it).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use spate_dstream::{GraphBuilder, QueueSource};
    /// # let builder = GraphBuilder::new(spate_core::Duration::from_secs(1)).checkpointing(true);
    /// // (user, (time, page)): each user's latest page, later pages by name on a tie.
    /// let visits = builder.input("visits", Arc::new(QueueSource::<(u64, (i64, String))>::new()));
    /// let latest = visits.dedup_latest_by_key(|a, b| a.cmp(b)).name("latest-page");
    /// # let _ = latest;
    /// ```
    pub fn dedup_latest_by_key<F>(&self, compare: F) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> Ordering + Send + Sync + 'static,
    {
        self.upsert(
            "dedup_latest_by_key",
            move |_key, value, kept: &mut Option<V>| match kept {
                Some(old) if compare(&value, old) != Ordering::Greater => false,
                _ => {
                    *kept = Some(value);
                    true
                }
            },
            |key, kept, out| out.push((key.clone(), kept.clone())),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::DStream;
    use crate::upsert::tests::run_both;

    #[test]
    fn each_key_emits_its_latest_record_when_a_batch_brings_a_later_one() {
        // (key, (time, tag)): by time, then tag.
        let rows = run_both(
            |s: &DStream<(u8, (i64, char))>| s.dedup_latest_by_key(|a, b| a.cmp(b)),
            vec![
                vec![vec![(1, (5, 'a')), (2, (1, 'a'))], vec![(1, (3, 'b')), (1, (5, 'c'))]],
                // Older records, and an equal one, change nothing.
                vec![vec![(1, (4, 'z')), (2, (1, 'a'))], vec![(2, (0, 'z'))]],
                vec![vec![(2, (2, 'a'))], vec![(1, (9, 'a')), (1, (6, 'a'))]],
            ],
        );
        assert_eq!(rows, vec![vec![(1, (5, 'c')), (2, (1, 'a'))], vec![], vec![(1, (9, 'a')), (2, (2, 'a'))]]);
    }
}
