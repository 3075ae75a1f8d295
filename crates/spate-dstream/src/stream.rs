//! [`DStream`]: a handle to one stream of the graph being built, and the
//! transformations that work on any element type.

use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use std::cell::Cell;

use spate_core::{Duration, InPlace, Views};

use crate::arrival::PayloadFn;
use crate::batch::{Batch, Data};
use crate::error::{BoxError, DStreamError};
use crate::event_time::ProgressMark;
use crate::graph::Job;
use crate::graph::SharedBuilder;
use crate::node::{BinaryNode, Node, NodeMeta, PartitionNode, Slot, StepCtx, UnaryNode};

/// A stream of batches in a graph being built. Cheap to clone; every
/// transformation adds an operator to the graph and returns its stream.
pub struct DStream<T> {
    pub(crate) builder: SharedBuilder,
    pub(crate) id: usize,
    /// The operator `.name()` renames: the stateful one of a composite.
    pub(crate) name_target: usize,
    pub(crate) slot: Arc<Slot<T>>,
    pub(crate) slide: Duration,
    /// Where an event-time operator reading this stream takes its progress
    /// from, when not from the records (see [`DStream::with_progress`]).
    pub(crate) progress: Option<ProgressFeed>,
}

impl<T> Clone for DStream<T> {
    fn clone(&self) -> Self {
        DStream {
            builder: Rc::clone(&self.builder),
            id: self.id,
            name_target: self.name_target,
            slot: Arc::clone(&self.slot),
            slide: self.slide,
            progress: self.progress.clone(),
        }
    }
}

/// The stream of [`ProgressMark`]s an event-time operator aligns on.
#[derive(Clone)]
pub(crate) struct ProgressFeed {
    marks: Box<DStream<ProgressMark>>,
}

impl ProgressFeed {
    pub(crate) fn of(marks: &DStream<ProgressMark>) -> Self {
        ProgressFeed { marks: Box::new(marks.clone()) }
    }

    /// The operator producing the marks (a parent of the reader).
    pub(crate) fn id(&self) -> usize {
        self.marks.id
    }

    /// Registers a consumer of the marks and returns the slot to read.
    pub(crate) fn reader(&self) -> Arc<Slot<ProgressMark>> {
        self.marks.reader()
    }

    /// The marks.
    pub(crate) fn marks(&self) -> DStream<ProgressMark> {
        (*self.marks).clone()
    }
}

impl<T> fmt::Debug for DStream<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DStream").field("operator", &self.id).field("slide", &self.slide).finish()
    }
}

impl<T: Data> DStream<T> {
    pub(crate) fn from_parts(builder: SharedBuilder, id: usize, slot: Arc<Slot<T>>, slide: Duration) -> Self {
        DStream { builder, id, name_target: id, slot, slide, progress: None }
    }

    /// Gives the operator that produces this stream a stable name. Stateful
    /// operators are matched by name when state is restored after an
    /// upgrade, so name every one of them.
    pub fn name(self, name: &str) -> Self {
        if let Some(meta) = self.builder.borrow_mut().metas.get_mut(self.name_target) {
            meta.name = Some(name.to_string());
        }
        self
    }

    /// How often this stream produces a batch.
    pub fn slide_duration(&self) -> Duration {
        self.slide
    }

    /// Lets the graph build with nobody reading this stream.
    pub(crate) fn may_go_unread(&self) {
        if let Some(meta) = self.builder.borrow_mut().metas.get_mut(self.id) {
            meta.may_go_unread = true;
        }
    }

    /// True when each of this stream's partitions holds distinct keys, each
    /// in the partition [`crate::partition_of`] gives it.
    pub(crate) fn keys_partitioned(&self) -> bool {
        self.builder.borrow().metas.get(self.id).is_some_and(|meta| meta.keys_partitioned)
    }

    /// Registers a consumer of this stream and returns the slot to read.
    pub(crate) fn reader(&self) -> Arc<Slot<T>> {
        self.slot.add_reader();
        if let Some(meta) = self.builder.borrow_mut().metas.get_mut(self.id) {
            meta.consumers += 1;
        }
        Arc::clone(&self.slot)
    }

    /// Adds a node whose result feeds a new stream.
    pub(crate) fn add_node<U: Data>(
        &self,
        meta: NodeMeta,
        node: impl FnOnce(Arc<Slot<U>>) -> Box<dyn Node>,
    ) -> DStream<U> {
        let slot = Slot::new();
        let slide = meta.slide;
        let boxed = node(Arc::clone(&slot));
        let id = self.builder.borrow_mut().push(meta, boxed);
        DStream::from_parts(Rc::clone(&self.builder), id, slot, slide)
    }

    /// A second output of this stream's operator, which fills `slot` while
    /// it runs (the state of `map_with_state`, the late records of an
    /// event-time window): a passive node that reads nothing itself.
    pub(crate) fn side_output<U: Data>(&self, kind: &'static str, slot: &Arc<Slot<U>>) -> DStream<U> {
        if let Some(meta) = self.builder.borrow_mut().metas.get_mut(self.id) {
            meta.consumers += 1;
        }
        let meta = NodeMeta::new(kind, vec![self.id], self.slide);
        let id = self.builder.borrow_mut().push(meta, Box::new(FilledByParent));
        DStream::from_parts(Rc::clone(&self.builder), id, Arc::clone(slot), self.slide)
    }

    /// Adds a node computing `f` of each batch of this stream.
    pub(crate) fn unary<U: Data, F>(&self, kind: &'static str, f: F) -> DStream<U>
    where
        F: FnMut(Batch<T>, &StepCtx<'_>) -> Result<Batch<U>, DStreamError> + Send + 'static,
    {
        let input = self.reader();
        let meta = NodeMeta::new(kind, vec![self.id], self.slide);
        self.add_node(meta, |output| Box::new(UnaryNode { input, output, f }))
    }

    /// Adds a node computing `f` of each batch of this stream and `other`.
    pub(crate) fn binary<B: Data, U: Data, F>(&self, kind: &'static str, other: &DStream<B>, f: F) -> DStream<U>
    where
        F: FnMut(Batch<T>, Batch<B>, &StepCtx<'_>) -> Result<Batch<U>, DStreamError> + Send + 'static,
    {
        let left = self.reader();
        let right = other.reader();
        let meta = NodeMeta::new(kind, vec![self.id, other.id], self.slide);
        self.add_node(meta, |output| Box::new(BinaryNode { left, right, output, f }))
    }

    /// Applies `f` to each partition, in parallel, keeping the partitioning.
    /// Right after a fed input, `f` runs on each block as it arrives (see
    /// [`crate::arrival`]).
    pub(crate) fn per_partition<U: Data, F>(&self, kind: &'static str, f: F) -> DStream<U>
    where
        F: Fn(Vec<T>) -> Vec<U> + Send + Sync + 'static,
    {
        self.per_partition_with(kind, f, None)
    }

    /// [`DStream::per_partition`], with `in_place`: `f` over the records
    /// of an encoded block, read in place, for the blocks that arrive so.
    fn per_partition_with<U: Data, F>(
        &self,
        kind: &'static str,
        f: F,
        in_place: Option<Arc<PayloadFn<U>>>,
    ) -> DStream<U>
    where
        F: Fn(Vec<T>) -> Vec<U> + Send + Sync + 'static,
    {
        let input = self.reader();
        let mut meta = NodeMeta::new(kind, vec![self.id], self.slide);
        meta.partition_local = true;
        // The operators whose result over a partition is the concatenation
        // of their results over its pieces: a source may run them on chunks.
        let record_wise = matches!(kind, "map" | "flat_map" | "filter" | "map_values");
        self.add_node(meta, |output| {
            Box::new(PartitionNode { input, output, f: Arc::new(f), in_place, record_wise, delivered: None })
        })
    }

    /// Applies `f` to every record.
    pub fn map<U: Data, F>(&self, f: F) -> DStream<U>
    where
        F: Fn(T) -> U + Send + Sync + 'static,
    {
        self.per_partition("map", move |part| part.into_iter().map(&f).collect())
    }

    /// Applies `f` to every record and flattens what it returns.
    pub fn flat_map<U: Data, I, F>(&self, f: F) -> DStream<U>
    where
        I: IntoIterator<Item = U>,
        F: Fn(T) -> I + Send + Sync + 'static,
    {
        self.per_partition("flat_map", move |part| {
            // Most flat maps give each record zero or one record back:
            // room for one each spares the reallocations of a growing vector.
            let mut out = Vec::with_capacity(part.len());
            for record in part {
                out.extend(f(record));
            }
            out
        })
    }

    /// Keeps the records for which `keep` is true.
    pub fn filter<F>(&self, keep: F) -> DStream<T>
    where
        F: Fn(&T) -> bool + Send + Sync + 'static,
    {
        self.per_partition("filter", move |mut part| {
            part.retain(&keep);
            part
        })
    }

    /// Applies `f` to each whole partition.
    pub fn map_partitions<U: Data, F>(&self, f: F) -> DStream<U>
    where
        F: Fn(Vec<T>) -> Vec<U> + Send + Sync + 'static,
    {
        self.per_partition("map_partitions", f)
    }

    /// Applies `f` to each whole partition, whose records it reads in place:
    /// as views (`&str` for a stream of `String`s) rather than as owned
    /// records. Right after a received input, `f` reads each block straight
    /// from its encoded bytes as the block arrives: no record is decoded into
    /// an allocation of its own, and `f` copies only what it keeps (a word
    /// the first time it counts it). Elsewhere `f` reads views of the
    /// decoded records; the result is the same.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use spate_dstream::{GraphBuilder, KeyHashMap, QueueSource, Views};
    ///
    /// let graph = GraphBuilder::new(spate_core::Duration::from_secs(1));
    /// let words = graph.input("words", Arc::new(QueueSource::<String>::new()));
    /// let counts = words.map_partitions_in_place(|words: Views<'_, String>| {
    ///     let mut counts: KeyHashMap<String, u64> = KeyHashMap::default();
    ///     for word in words {
    ///         match counts.get_mut(word) {
    ///             Some(n) => *n += 1,
    ///             None => {
    ///                 counts.insert(word.to_owned(), 1);
    ///             }
    ///         }
    ///     }
    ///     counts.into_iter().collect::<Vec<_>>()
    /// });
    /// # let _ = counts;
    /// ```
    pub fn map_partitions_in_place<U: Data, F>(&self, f: F) -> DStream<U>
    where
        T: InPlace,
        F: Fn(Views<'_, T>) -> Vec<U> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let on_payload = Arc::clone(&f);
        let in_place = move |payload: &[u8]| {
            let failure = Cell::new(None);
            let out = on_payload(Views::of_payload(payload, &failure)?);
            failure.take().map_or(Ok(out), Err)
        };
        self.per_partition_with(
            "map_partitions_in_place",
            move |part: Vec<T>| f(Views::of_records(&part)),
            Some(Arc::new(in_place)),
        )
    }

    /// The records of this stream and `other`, batch by batch (both must
    /// have the same slide duration).
    pub fn union(&self, other: &DStream<T>) -> DStream<T> {
        self.binary("union", other, |mut left, right, _ctx| {
            left.append(right);
            Ok(left)
        })
    }

    /// Applies any function to each whole batch; it also gets the batch time.
    ///
    /// Needs the whole batch: its input is gathered at the batch boundary
    /// and decoded then (not processed as blocks arrive). Until then a
    /// received input's blocks wait encoded and, beyond the memory budget
    /// (`--max-memory`), spill to a RocksDB store on disk; the decoded
    /// batch is in memory, so that grows with the batch's records. Put partition-local operators (`filter`,
    /// `map`, `flat_map`) before it to shrink what it gathers.
    pub fn transform<U: Data, F>(&self, f: F) -> DStream<U>
    where
        F: Fn(Batch<T>, spate_core::Time) -> Result<Batch<U>, BoxError> + Send + 'static,
    {
        self.unary("transform", move |batch, ctx| {
            f(batch, ctx.time).map_err(|source| DStreamError::Operator {
                operator: ctx.operator.to_string(),
                time: ctx.time,
                source,
            })
        })
    }

    /// Applies any function to each pair of batches of this stream and
    /// `other` at the same time (both must have the same slide duration).
    ///
    /// Needs the whole batch: its input is gathered at the batch boundary
    /// and decoded then (not processed as blocks arrive). Until then a
    /// received input's blocks wait encoded and, beyond the memory budget
    /// (`--max-memory`), spill to a RocksDB store on disk; the decoded
    /// batch is in memory, so that grows with the batch's records. Put partition-local operators (`filter`,
    /// `map`, `flat_map`) before it to shrink what it gathers.
    pub fn transform_with<B: Data, U: Data, F>(&self, other: &DStream<B>, f: F) -> DStream<U>
    where
        F: Fn(Batch<T>, Batch<B>, spate_core::Time) -> Result<Batch<U>, BoxError> + Send + 'static,
    {
        self.binary("transform_with", other, move |left, right, ctx| {
            f(left, right, ctx.time).map_err(|source| DStreamError::Operator {
                operator: ctx.operator.to_string(),
                time: ctx.time,
                source,
            })
        })
    }

    /// Spreads the records round-robin over `partitions` partitions.
    pub fn repartition(&self, partitions: usize) -> DStream<T> {
        let partitions = partitions.max(1);
        self.unary("repartition", move |batch, _ctx| {
            let total = batch.len();
            let mut out: Vec<Vec<T>> =
                (0..partitions).map(|_| Vec::with_capacity(total.div_ceil(partitions))).collect();
            for (index, record) in batch.into_vec().into_iter().enumerate() {
                if let Some(part) = out.get_mut(index % partitions) {
                    part.push(record);
                }
            }
            Ok(Batch::new(out))
        })
    }

    /// A batch holding one record: the number of records in the batch (0 when empty).
    pub fn count(&self) -> DStream<u64> {
        self.unary("count", |batch, _ctx| Ok(Batch::from_vec(vec![batch.len() as u64])))
    }
}

/// A passive node: its slot is filled by the operator before it.
struct FilledByParent;

impl Node for FilledByParent {
    fn step(&mut self, _ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        Ok(None)
    }
}
