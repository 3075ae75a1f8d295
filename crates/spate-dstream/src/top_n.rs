//! The top N records per key ([`DStream::top_n_by_key`]): SQL's
//! `ROW_NUMBER() OVER (PARTITION BY key ORDER BY …) <= N` over an unbounded
//! table, as an upsert stream of each key's ranking.

use std::cmp::Ordering;

use crate::batch::{Data, Key};
use crate::stream::DStream;

/// Puts `value` into `top` (best first by `compare`, at most `n` long);
/// returns whether the ranking changed. A value equal to one ranked goes
/// after it.
fn rank<V>(top: &mut Vec<V>, value: V, n: usize, compare: &impl Fn(&V, &V) -> Ordering) -> bool {
    let at = top.partition_point(|ranked| compare(ranked, &value) != Ordering::Less);
    if at >= n {
        return false;
    }
    top.insert(at, value);
    top.truncate(n);
    true
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Keeps, per key, the `n` greatest records by `compare` and emits
    /// `(key, ranking)` (greatest first, at most `n` records, the first
    /// having rank 1) after each batch in which a key's ranking changed. A
    /// record equal by `compare` to one ranked comes after it, so with a
    /// total order on the records the ranking does not depend on their
    /// order. Keeps at most `n` records per key for ever (stateful: name it).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use spate_dstream::{GraphBuilder, QueueSource};
    /// # let builder = GraphBuilder::new(spate_core::Duration::from_secs(1)).checkpointing(true);
    /// // (game, (score, player)): each game's three best scores.
    /// let scores = builder.input("scores", Arc::new(QueueSource::<(u64, (u64, String))>::new()));
    /// let podium = scores.top_n_by_key(3, |a, b| a.cmp(b)).name("podium");
    /// # let _ = podium;
    /// ```
    pub fn top_n_by_key<F>(&self, n: usize, compare: F) -> DStream<(K, Vec<V>)>
    where
        F: Fn(&V, &V) -> Ordering + Send + Sync + 'static,
    {
        self.upsert(
            "top_n_by_key",
            move |_key, value, kept: &mut Option<Vec<V>>| {
                let top = kept.get_or_insert_with(|| Vec::with_capacity(n.min(16)));
                rank(top, value, n, &compare)
            },
            |key, top, out| out.push((key.clone(), top.clone())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::rank;
    use crate::DStream;
    use crate::upsert::tests::run_both;

    #[test]
    fn ranking_keeps_the_n_greatest_best_first_and_ties_after_the_ranked() {
        let by_first = |a: &(u8, char), b: &(u8, char)| a.0.cmp(&b.0);
        let mut top = Vec::new();
        assert!(rank(&mut top, (5, 'a'), 3, &by_first));
        assert!(rank(&mut top, (7, 'b'), 3, &by_first));
        assert!(rank(&mut top, (5, 'c'), 3, &by_first));
        assert_eq!(top, [(7, 'b'), (5, 'a'), (5, 'c')]);
        // Equal to the last ranked: it would be fourth.
        assert!(!rank(&mut top, (5, 'd'), 3, &by_first));
        assert!(rank(&mut top, (6, 'e'), 3, &by_first));
        assert_eq!(top, [(7, 'b'), (6, 'e'), (5, 'a')]);
    }

    #[test]
    fn each_key_emits_its_ranking_after_a_batch_that_changed_it() {
        let rows = run_both(
            |s: &DStream<(u8, u32)>| s.top_n_by_key(2, |a, b| a.cmp(b)),
            vec![
                vec![vec![(1, 5), (2, 1)], vec![(1, 7), (1, 6)]],
                // Below key 1's second: nothing changes.
                vec![vec![(1, 4)], vec![(1, 2)]],
                vec![vec![(2, 3)], vec![(1, 8)]],
            ],
        );
        assert_eq!(rows, vec![vec![(1, vec![7, 6]), (2, vec![1])], vec![], vec![(1, vec![8, 7]), (2, vec![3, 1])]]);
    }
}
