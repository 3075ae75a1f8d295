//! The top N records: of each batch ([`DStream::top_n`], Spark's
//! `rdd.top(n)` as a stream), and per key ([`DStream::top_n_by_key`]:
//! SQL's `ROW_NUMBER() OVER (PARTITION BY key ORDER BY …) <= N` over an
//! unbounded table, as an upsert stream of each key's ranking).
//!
//! A batch's top N needs only each partition's top N, so the operator
//! whose result `top_n` alone reads may pick them while it lists its
//! result ([`Node::list_only_greatest`](crate::node::Node)): a window (or
//! `update_state_by_key`) over a million keys then lists N records a
//! partition, not a million.

use std::any::Any;
use std::cmp::Ordering;
use std::sync::Arc;

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::node::{Node, NodeMeta, Slot, StepCtx};
use crate::stream::DStream;

/// How two records compare (`Greater`: the first is the greater).
type CompareFn<T> = dyn Fn(&T, &T) -> Ordering + Send + Sync;

/// Which records a reader keeps of each batch: the `n` greatest by
/// `compare`. Handed to the operator before it (boxed) to pick them itself.
pub(crate) struct Greatest<T> {
    n: usize,
    compare: Arc<CompareFn<T>>,
}

impl<T> Clone for Greatest<T> {
    fn clone(&self) -> Self {
        Greatest { n: self.n, compare: Arc::clone(&self.compare) }
    }
}

impl<T> Greatest<T> {
    /// A picker that keeps the greatest of the records offered to it.
    fn picker(&self) -> Picker<'_, T> {
        Picker { of: self, kept: Vec::new(), floor: false }
    }

    /// `a` before `b` when it is the greater.
    fn greater_first(&self, a: &T, b: &T) -> Ordering {
        (self.compare)(b, a)
    }
}

/// Takes the `greatest` a `top_n` reader wants (see
/// [`Node::list_only_greatest`](crate::node::Node)) into `slot` when it
/// picks records of type `T` (a reader of the operator's result does).
pub(crate) fn take_greatest<T: 'static>(slot: &mut Option<Greatest<T>>, greatest: Box<dyn Any>) {
    if let Ok(greatest) = greatest.downcast::<Greatest<T>>() {
        *slot = Some(*greatest);
    }
}

/// An operator's result as it lists it: every record, or the greatest of
/// them when its only reader is a `top_n`.
pub(crate) enum Listed<'a, T> {
    Every(Vec<T>),
    Greatest(Picker<'a, T>),
}

impl<'a, T> Listed<'a, T> {
    /// Lists every record (room for `capacity`), or only the `greatest`.
    pub(crate) fn new(greatest: Option<&'a Greatest<T>>, capacity: usize) -> Self {
        match greatest {
            Some(greatest) => Listed::Greatest(greatest.picker()),
            None => Listed::Every(Vec::with_capacity(capacity)),
        }
    }

    pub(crate) fn push(&mut self, record: T) {
        match self {
            Listed::Every(records) => records.push(record),
            Listed::Greatest(picker) => picker.offer(record),
        }
    }

    /// The records listed.
    pub(crate) fn into_vec(self) -> Vec<T> {
        match self {
            Listed::Every(records) => records,
            Listed::Greatest(picker) => picker.into_kept(),
        }
    }
}

/// The `n` greatest records offered so far, in room for at most twice `n`
/// (and a few): records go in as offered and the excess is cut off in one
/// selection, after which a record no greater than the `n`th is refused.
pub(crate) struct Picker<'a, T> {
    of: &'a Greatest<T>,
    kept: Vec<T>,
    /// `kept[n - 1]` is the least of the `n` greatest kept so far.
    floor: bool,
}

impl<T> Picker<'_, T> {
    /// Offers `record`, which goes unless `n` records at least as great
    /// are kept.
    pub(crate) fn offer(&mut self, record: T) {
        if !self.refuses(&record) {
            self.keep(record);
        }
    }

    /// Offers a copy of `record`, made only when it goes in.
    pub(crate) fn offer_copy(&mut self, record: &T)
    where
        T: Clone,
    {
        if !self.refuses(record) {
            self.keep(record.clone());
        }
    }

    /// Keeps a record not refused, cutting the excess once there is room
    /// for no more.
    fn keep(&mut self, record: T) {
        self.kept.push(record);
        // Saturating: `n` may be "all of them" (`usize::MAX`).
        if self.kept.len() >= self.of.n.saturating_mul(2).saturating_add(64) {
            self.cut();
        }
    }

    fn refuses(&self, record: &T) -> bool {
        let n = self.of.n;
        n == 0 || (self.floor && self.kept.get(n - 1).is_some_and(|least| (self.of.compare)(record, least).is_le()))
    }

    /// Keeps the `n` greatest, the least of them last.
    fn cut(&mut self) {
        let n = self.of.n;
        if self.kept.len() > n && n > 0 {
            self.kept.select_nth_unstable_by(n - 1, |a, b| self.of.greater_first(a, b));
            self.kept.truncate(n);
            self.floor = true;
        }
    }

    /// The greatest records offered, at most `n`, unordered.
    fn into_kept(mut self) -> Vec<T> {
        self.cut();
        self.kept
    }

    /// The greatest records offered, at most `n`, the greatest first.
    fn into_ranked(self) -> Vec<T> {
        let of = self.of;
        let mut kept = self.into_kept();
        kept.sort_by(|a, b| of.greater_first(a, b));
        kept
    }
}

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

impl<T: Data> DStream<T> {
    /// Each batch's `n` greatest records by `compare`, the greatest first,
    /// in one partition (Spark's `rdd.top(n)` of each batch). Of records
    /// that `compare` finds equal, which are kept is not specified: for a
    /// result that does not depend on the batch's partitioning, make
    /// `compare` a total order (break ties on a key).
    ///
    /// When it alone reads the result of a window or of
    /// `update_state_by_key`, that operator picks each partition's `n`
    /// greatest as it lists its result, so a window of a million keys does
    /// not list them all for a top ten.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use spate_dstream::{GraphBuilder, QueueSource};
    /// # let builder = GraphBuilder::new(spate_core::Duration::from_secs(1));
    /// // (word, count): each batch's three most frequent words, ties by word.
    /// let counts = builder.input("counts", Arc::new(QueueSource::<(String, u64)>::new()));
    /// let top = counts.top_n(3, |a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)));
    /// # let _ = top;
    /// ```
    pub fn top_n<F>(&self, n: usize, compare: F) -> DStream<T>
    where
        F: Fn(&T, &T) -> Ordering + Send + Sync + 'static,
    {
        let input = self.reader();
        let greatest = Greatest { n, compare: Arc::new(compare) };
        let meta = NodeMeta::new("top_n", vec![self.id], self.slide);
        self.add_node(meta, |output| Box::new(TopNode { input, output, greatest }))
    }
}

/// Each batch's greatest records ([`DStream::top_n`]).
struct TopNode<T> {
    input: Arc<Slot<T>>,
    output: Arc<Slot<T>>,
    greatest: Greatest<T>,
}

impl<T: Data> Node for TopNode<T> {
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let Some(batch) = ctx.take(&self.input)? else {
            self.output.put(ctx.time, None);
            return Ok(None);
        };
        let greatest = &self.greatest;
        let picked = ctx.par(batch.partitions().iter().collect(), |part: &Vec<T>| {
            let mut picker = greatest.picker();
            part.iter().for_each(|record| picker.offer_copy(record));
            picker.into_kept()
        })?;
        let mut picker = greatest.picker();
        picked.into_iter().flatten().for_each(|record| picker.offer(record));
        self.output.put(ctx.time, Some(Batch::from_vec(picker.into_ranked())));
        Ok(None)
    }

    fn greatest_wanted(&self) -> Option<Box<dyn Any>> {
        Some(Box::new(self.greatest.clone()))
    }
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
    use std::sync::{Arc, Mutex};

    use spate_core::{BatchId, Duration, Time};

    use super::{Greatest, rank};
    use crate::upsert::tests::run_both;
    use crate::{DStream, GraphBuilder, QueueSource};

    type Word = (String, u64);

    /// Higher counts first, then words in order: a total order.
    fn by_count(a: &(String, u64), b: &(String, u64)) -> std::cmp::Ordering {
        a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))
    }

    /// `records`' `n` greatest by [`by_count`], the greatest first.
    fn ranked(mut records: Vec<(String, u64)>, n: usize) -> Vec<(String, u64)> {
        records.sort_by(|a, b| by_count(b, a));
        records.truncate(n);
        records
    }

    /// `keys` words with scattered counts, some equal.
    fn words(keys: u64) -> Vec<(String, u64)> {
        (0..keys).map(|k| (format!("w{k}"), k * 7919 % 97)).collect()
    }

    #[test]
    fn a_picker_keeps_the_n_greatest_whatever_the_order_offered() {
        for n in [0, 1, 5, 100, 2_000, usize::MAX] {
            let greatest = Greatest { n, compare: Arc::new(by_count) };
            let mut picker = greatest.picker();
            words(1_000).iter().for_each(|word| picker.offer_copy(word));
            assert_eq!(picker.into_ranked(), ranked(words(1_000), n), "n = {n}");
        }
    }

    #[test]
    fn top_n_ranks_each_batch_greatest_first_over_its_partitions() {
        let builder = GraphBuilder::new(Duration::from_secs(1)).partitions(3);
        let queue = Arc::new(QueueSource::new());
        let seen: Arc<Mutex<Vec<Vec<Word>>>> = Arc::default();
        let sink = Arc::clone(&seen);
        builder.input("words", Arc::clone(&queue)).top_n(4, by_count).foreach_batch(move |batch, _| {
            sink.lock().unwrap().push(batch.iter().cloned().collect());
            Ok(())
        });
        let mut graph = builder.build().unwrap();
        let all = words(300);
        queue.push_partitions(all.chunks(100).map(<[_]>::to_vec).collect());
        queue.push(Vec::new());
        graph.run_batch(Time::from_millis(1000), BatchId(1)).unwrap();
        graph.run_batch(Time::from_millis(2000), BatchId(2)).unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![ranked(all, 4), Vec::new()]);
    }

    /// A keyed operator summing counts: a window of 2 s sliding by 1 s, or
    /// a running total.
    type Keyed = fn(&DStream<Word>) -> DStream<Word>;

    fn inverse_window(words: &DStream<Word>) -> DStream<Word> {
        let second = Duration::from_secs(1);
        words.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, second.times(2), second)
    }

    fn pane_window(words: &DStream<Word>) -> DStream<Word> {
        let second = Duration::from_secs(1);
        words.reduce_by_key_and_window(|a, b| a + b, second.times(2), second)
    }

    fn running_total(words: &DStream<Word>) -> DStream<Word> {
        words.update_state_by_key(|counts: Vec<u64>, total| Some(total.unwrap_or(0) + counts.iter().sum::<u64>()))
    }

    /// The sizes of the partitions of `keyed`'s result over [`words`],
    /// and the top 3 its `top_n` emitted; `also_listed`: another output
    /// reads its result too.
    fn keyed_then_top_3(keyed: Keyed, also_listed: bool) -> (Vec<usize>, Vec<Word>) {
        let builder = GraphBuilder::new(Duration::from_secs(1)).partitions(2).checkpointing(true);
        let queue = Arc::new(QueueSource::new());
        let windowed = keyed(&builder.input("words", Arc::clone(&queue))).name("keyed");
        if also_listed {
            windowed.foreach_batch(|_, _| Ok(()));
        }
        // Read here too, behind the graph's back: what the window listed.
        windowed.slot.add_reader();
        let top: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
        let sink = Arc::clone(&top);
        windowed.top_n(3, by_count).foreach_batch(move |batch, _| {
            *sink.lock().unwrap() = batch.iter().cloned().collect();
            Ok(())
        });
        let mut graph = builder.build().unwrap();
        queue.push(words(500));
        let time = Time::from_millis(1000);
        graph.run_batch(time, BatchId(1)).unwrap();
        let listed = windowed.slot.take(time).unwrap().unwrap();
        let sizes = listed.partitions().iter().map(Vec::len).collect();
        let top = top.lock().unwrap().clone();
        (sizes, top)
    }

    #[test]
    fn a_window_or_state_read_only_by_top_n_lists_only_each_partitions_greatest() {
        for keyed in [inverse_window as Keyed, pane_window, running_total] {
            let (sizes, top) = keyed_then_top_3(keyed, false);
            assert_eq!(sizes, [3, 3]);
            assert_eq!(top, ranked(words(500), 3));
            let (sizes, top) = keyed_then_top_3(keyed, true);
            assert_eq!(sizes.iter().sum::<usize>(), 500, "read by another output, it lists every key");
            assert_eq!(top, ranked(words(500), 3));
        }
    }

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
