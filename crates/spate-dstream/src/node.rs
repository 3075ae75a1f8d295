//! The pieces every operator is made of: the slot that carries a node's
//! batch to its consumers, the context a node runs in, and the node traits.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use spate_core::sync::lock;
use spate_core::{BatchId, CoreError, Duration, FrameCodec, ReadSeek, SeekWrite, Time};

use crate::arrival::{ArrivalStage, ArrivalStep, Delivered, PayloadFn};
use crate::batch::Batch;
use crate::error::DStreamError;
use crate::graph::Job;
use crate::pool::{Pool, TaskPanic};

/// The offsets each replayable input planned for one batch, by input name.
pub type PlannedOffsets = BTreeMap<String, String>;

/// The frame format version of operator state this build writes.
pub(crate) const STATE_FORMAT_VERSION: u16 = 1;

/// The codec for operator state.
pub(crate) fn state_codec() -> FrameCodec {
    // Window state can be large; the bounds still stop a damaged length
    // field from allocating without limit.
    FrameCodec::new(STATE_FORMAT_VERSION).with_max_payload(1 << 30).with_max_decoded(4 << 30)
}

/// Carries one node's batch for the current batch time to its consumers.
///
/// The batch is shared, not copied: every consumer takes a reference to the
/// same batch, and the slot lets go of it when the last one has. A consumer
/// that reads (an output) keeps the reference; one that needs the records
/// by value gets them without a copy when it holds the last reference (see
/// [`StepCtx::take_owned`]). A node that produces nothing at a time (a
/// window between slides) puts `None`.
pub(crate) struct Slot<T> {
    inner: Mutex<SlotInner<T>>,
}

struct SlotInner<T> {
    readers: usize,
    left: usize,
    time: Option<Time>,
    value: Option<Arc<Batch<T>>>,
}

impl<T: Clone> Slot<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Slot { inner: Mutex::new(SlotInner { readers: 0, left: 0, time: None, value: None }) })
    }

    fn lock(&self) -> MutexGuard<'_, SlotInner<T>> {
        lock(&self.inner)
    }

    /// Registers one more consumer (while the graph is built).
    pub(crate) fn add_reader(&self) {
        self.lock().readers += 1;
    }

    /// The number of registered consumers.
    pub(crate) fn readers(&self) -> usize {
        self.lock().readers
    }

    /// Publishes the node's result for `time`.
    pub(crate) fn put(&self, time: Time, value: Option<Batch<T>>) {
        let mut inner = self.lock();
        inner.left = inner.readers;
        inner.time = Some(time);
        inner.value = if inner.readers == 0 { None } else { value.map(Arc::new) };
    }

    /// Takes the result for `time`: `Ok(None)` when the node produced nothing then.
    pub(crate) fn take(&self, time: Time) -> Result<Option<Arc<Batch<T>>>, String> {
        let mut inner = self.lock();
        if inner.time != Some(time) || inner.left == 0 {
            return Err(format!(
                "no result for time {time} (slot holds {:?}, {} readers left)",
                inner.time, inner.left
            ));
        }
        inner.left -= 1;
        Ok(if inner.left == 0 { inner.value.take() } else { inner.value.as_ref().map(Arc::clone) })
    }
}

/// What a node sees while it runs for one batch time.
pub(crate) struct StepCtx<'a> {
    pub(crate) time: Time,
    pub(crate) batch_id: BatchId,
    pub(crate) pool: Pool,
    pub(crate) partitions: usize,
    pub(crate) planned: &'a PlannedOffsets,
    pub(crate) operator: &'a str,
    /// Records the batch set aside as late, over every operator.
    pub(crate) late: &'a AtomicU64,
    /// False when the batch is recomputed for state alone and nothing
    /// stateful reads this operator's result: an operator may then put
    /// none (see [`crate::Graph::recompute_for_state`]).
    pub(crate) result_wanted: bool,
}

impl StepCtx<'_> {
    /// An error in the operator's own state (a key table, a slice or a
    /// pane that does not decode): a defect, reported with the operator.
    pub(crate) fn state_error(&self, error: &CoreError) -> DStreamError {
        DStreamError::Internal { operator: self.operator.to_string(), reason: format!("operator state: {error}") }
    }

    /// Adds `count` records to the batch's late records.
    pub(crate) fn count_late(&self, count: usize) {
        self.late.fetch_add(u64::try_from(count).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Runs `f` over `items` on the pool, naming this operator if a task panics.
    pub(crate) fn par<I: Send, O: Send>(
        &self,
        items: Vec<I>,
        f: impl Fn(I) -> O + Sync,
    ) -> Result<Vec<O>, DStreamError> {
        self.pool.map(items, f).map_err(|TaskPanic(message)| DStreamError::TaskPanicked {
            operator: self.operator.to_string(),
            time: self.time,
            message,
        })
    }

    /// Takes a reference to the parent's batch, turning bookkeeping errors
    /// into [`DStreamError::Internal`].
    pub(crate) fn take<T: Clone>(&self, slot: &Slot<T>) -> Result<Option<Arc<Batch<T>>>, DStreamError> {
        slot.take(self.time).map_err(|reason| DStreamError::Internal { operator: self.operator.to_string(), reason })
    }

    /// Takes the parent's batch by value: without a copy when no other
    /// consumer still holds it (the usual case, a stream read once), copied
    /// otherwise.
    pub(crate) fn take_owned<T: Clone>(&self, slot: &Slot<T>) -> Result<Option<Batch<T>>, DStreamError> {
        Ok(self.take(slot)?.map(Arc::unwrap_or_clone))
    }
}

/// One operator of the graph, type-erased.
pub(crate) trait Node: Send {
    /// Computes this node's result for `ctx.time` from its parents' slots.
    /// Output nodes return the job that will write the result.
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError>;

    /// The node's state, when it keeps any.
    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        None
    }

    /// A partition-local operator's function as an [`ArrivalStage`] of its
    /// input's record type (boxed), and where its results will be delivered.
    fn arrival_stage(&self, operator: &str) -> Option<(Box<dyn Any>, Arc<Delivered>)> {
        let _ = operator;
        None
    }

    /// A partition-local operator's function as a later step of an arrival
    /// chain (see [`ArrivalStage::then`]).
    fn arrival_step(&self, operator: &str) -> Option<ArrivalStep> {
        let _ = operator;
        None
    }

    /// From now on, takes the processed blocks delivered to `delivered`.
    fn take_delivered(&mut self, delivered: Arc<Delivered>) {
        let _ = delivered;
    }

    /// A per-key aggregate whose blocks combine on arrival: its
    /// [`CombinedBlocks`](crate::pair::CombinedBlocks), boxed, for the
    /// only reader of its result to take over.
    fn combined_hand_over(&self) -> Option<Box<dyn Any>> {
        None
    }

    /// The aggregate's blocks were taken over by its reader, in a graph
    /// of `partitions` partitions: from now on it splits each block for
    /// the reader on arrival and combines only the records of its input
    /// batches.
    fn combined_handed_over(&mut self, _partitions: usize) {}

    /// A reader of a per-key aggregate's result: takes over the
    /// aggregate's blocks combined on arrival (what
    /// [`Node::combined_hand_over`] gave) and merges them with the
    /// aggregate's result itself; false when it does not.
    fn take_combined(&mut self, blocks: Box<dyn Any>) -> bool {
        let _ = blocks;
        false
    }

    /// A reader that keeps only each batch's greatest records: which it
    /// keeps (a [`Greatest`](crate::top_n::Greatest) of its record type,
    /// boxed), for the operator before it to pick them itself.
    fn greatest_wanted(&self) -> Option<Box<dyn Any>> {
        None
    }

    /// Its only reader keeps just the records `greatest` (what
    /// [`Node::greatest_wanted`] gave) picks of each batch: from now on an
    /// operator that can lists only those of each partition of its result.
    fn list_only_greatest(&mut self, greatest: Box<dyn Any>) {
        let _ = greatest;
    }

    /// An input: passes `stage` (an [`ArrivalStage`] of its record type)
    /// followed by as many of `steps` as its source takes, longest chain
    /// first, to the source; how many steps it took, `None` when it runs
    /// no stage on arrival.
    fn offer_arrival_stage(&mut self, stage: Box<dyn Any>, steps: &[ArrivalStep]) -> Option<usize> {
        let _ = (stage, steps);
        None
    }
}

/// An operator that keeps state across batches.
///
/// An operator whose state is large may also snapshot what changed since
/// its previous snapshot ([`StatefulNode::snapshot_changes`]); a restore
/// then reads a whole snapshot followed by the changes taken after it.
pub(crate) trait StatefulNode {
    /// The whole state as one [`FrameCodec`] frame. Changes taken later
    /// are relative to it.
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError>;

    /// [`StatefulNode::snapshot`] written to `out`; returns the bytes
    /// written. An operator whose state can outgrow memory streams it.
    fn snapshot_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        let bytes = self.snapshot()?;
        out.write_all(&bytes).map_err(|source| CoreError::Write { source })?;
        Ok(bytes.len() as u64)
    }

    /// What changed since the previous snapshot (whole or changes), as one
    /// frame; `None` when the operator only snapshots whole.
    fn snapshot_changes(&mut self) -> Option<Result<Vec<u8>, CoreError>> {
        None
    }

    /// True when [`StatefulNode::snapshot_changes`] would give changes
    /// now (not `None`).
    fn takes_changes(&self) -> bool {
        false
    }

    /// [`StatefulNode::snapshot_changes`] written to `out`, when
    /// [`StatefulNode::takes_changes`]; returns the bytes written. An
    /// operator whose changes can be large streams them.
    fn snapshot_changes_to(&mut self, out: &mut dyn SeekWrite) -> Result<u64, CoreError> {
        let Some(bytes) = self.snapshot_changes() else {
            return Err(CoreError::Encode { reason: "this operator's state is only snapshot whole".to_string() });
        };
        let bytes = bytes?;
        out.write_all(&bytes).map_err(|source| CoreError::Write { source })?;
        Ok(bytes.len() as u64)
    }

    /// Replaces the state with a whole snapshot, spreading keys over `partitions`.
    fn restore(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError>;

    /// [`StatefulNode::restore`] from `reader`, at the snapshot's frame. An
    /// operator whose state can outgrow memory decodes it as it reads.
    fn restore_from(&mut self, reader: &mut dyn ReadSeek, partitions: usize) -> Result<(), CoreError> {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(|source| CoreError::Read { source })?;
        self.restore(&bytes, partitions)
    }

    /// Applies changes taken after the snapshot restored last (and after
    /// the changes applied since), in the order they were taken.
    fn apply_changes(&mut self, bytes: &[u8], partitions: usize) -> Result<(), CoreError> {
        let _ = (bytes, partitions);
        Err(CoreError::Decode { reason: "this operator's state is only snapshot whole".to_string() })
    }

    /// [`StatefulNode::apply_changes`] from `reader`, at the changes'
    /// frame. An operator whose changes can be large applies them as it
    /// reads.
    fn apply_changes_from(&mut self, reader: &mut dyn ReadSeek, partitions: usize) -> Result<(), CoreError> {
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).map_err(|source| CoreError::Read { source })?;
        self.apply_changes(&bytes, partitions)
    }

    /// Lets the operator (named `operator`) move state beyond its budget
    /// to `spill`; operators that cannot keep it there ignore it.
    fn use_spill(&mut self, operator: &str, spill: &crate::spill::StateSpill) {
        let _ = (operator, spill);
    }
}

/// Facts about a stateful operator that must match across an upgrade.
#[derive(Clone, Debug)]
pub(crate) struct StateMeta {
    pub(crate) key_type: Option<&'static str>,
    pub(crate) value_type: &'static str,
    pub(crate) state_type: &'static str,
    pub(crate) needs_checkpoint: bool,
}

/// What the builder records about each node.
#[derive(Clone, Debug)]
pub(crate) struct NodeMeta {
    pub(crate) name: Option<String>,
    pub(crate) kind: &'static str,
    pub(crate) parents: Vec<usize>,
    pub(crate) consumers: usize,
    pub(crate) slide: Duration,
    pub(crate) is_output: bool,
    pub(crate) input: bool,
    /// A `map`, `filter`, `flat_map` or `map_partitions`: each output
    /// partition is a function of one input partition.
    pub(crate) partition_local: bool,
    pub(crate) window: Option<(Duration, Duration)>,
    pub(crate) state: Option<StateMeta>,
    /// The shape of an event-time operator's windows (what its state
    /// depends on), recorded in the descriptor.
    pub(crate) event_time: Option<String>,
    /// Why its windows cannot be computed, found when it was declared.
    pub(crate) event_time_problem: Option<String>,
    /// Nobody need read it (progress marks that no event-time operator uses).
    pub(crate) may_go_unread: bool,
    /// Each output partition holds distinct keys, each in the partition
    /// [`crate::partition_of`] gives it (the result of a by-key combine).
    pub(crate) keys_partitioned: bool,
}

impl NodeMeta {
    pub(crate) fn new(kind: &'static str, parents: Vec<usize>, slide: Duration) -> Self {
        NodeMeta {
            name: None,
            kind,
            parents,
            consumers: 0,
            slide,
            is_output: false,
            input: false,
            partition_local: false,
            window: None,
            state: None,
            event_time: None,
            event_time_problem: None,
            may_go_unread: false,
            keys_partitioned: false,
        }
    }
}

/// A node whose result is a function of one parent's batch.
pub(crate) struct UnaryNode<T, U, F> {
    pub(crate) input: Arc<Slot<T>>,
    pub(crate) output: Arc<Slot<U>>,
    pub(crate) f: F,
}

impl<T, U, F> Node for UnaryNode<T, U, F>
where
    T: Clone + Send + Sync,
    U: Clone + Send + Sync,
    F: FnMut(Batch<T>, &StepCtx<'_>) -> Result<Batch<U>, DStreamError> + Send,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let result = match ctx.take_owned(&self.input)? {
            Some(batch) => Some((self.f)(batch, ctx)?),
            None => None,
        };
        self.output.put(ctx.time, result);
        Ok(None)
    }
}

/// A partition-local operator: each output partition is `f` of one input
/// partition. Fused with a fed input (see [`crate::arrival`]), it takes the
/// partitions the runtime computed as blocks arrived before its own.
pub(crate) struct PartitionNode<T, U> {
    pub(crate) input: Arc<Slot<T>>,
    pub(crate) output: Arc<Slot<U>>,
    pub(crate) f: Arc<dyn Fn(Vec<T>) -> Vec<U> + Send + Sync>,
    /// `f` reading the records in place off an encoded block, when the
    /// operator has that form.
    pub(crate) in_place: Option<Arc<PayloadFn<U>>>,
    /// `f` works record by record, so its results over chunks of a partition
    /// concatenate into its result over the partition (see
    /// [`ArrivalStage::is_chunkable`]).
    pub(crate) record_wise: bool,
    pub(crate) delivered: Option<Arc<Delivered>>,
}

impl<T, U> Node for PartitionNode<T, U>
where
    T: Clone + Send + Sync + 'static,
    U: Clone + Send + Sync + 'static,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let Some(batch) = ctx.take_owned(&self.input)? else {
            self.output.put(ctx.time, None);
            return Ok(None);
        };
        let mut parts = Vec::new();
        if let Some(delivered) = &self.delivered {
            for part in delivered.take(ctx.time) {
                let part = part.downcast::<Vec<U>>().map_err(|_| DStreamError::Internal {
                    operator: ctx.operator.to_string(),
                    reason: "a processed block of another record type was delivered".into(),
                })?;
                parts.push(*part);
            }
        }
        let f = &*self.f;
        parts.extend(ctx.par(batch.into_partitions(), f)?);
        self.output.put(ctx.time, Some(Batch::new(parts)));
        Ok(None)
    }

    fn arrival_stage(&self, operator: &str) -> Option<(Box<dyn Any>, Arc<Delivered>)> {
        let delivered = Arc::new(Delivered::default());
        let stage = ArrivalStage::new(
            operator,
            Arc::clone(&self.f),
            self.in_place.clone(),
            self.record_wise,
            Arc::clone(&delivered),
        );
        Some((Box::new(stage), delivered))
    }

    fn arrival_step(&self, operator: &str) -> Option<ArrivalStep> {
        let delivered = Arc::new(Delivered::default());
        Some(ArrivalStep::new(operator, Arc::clone(&self.f), self.record_wise, delivered))
    }

    fn take_delivered(&mut self, delivered: Arc<Delivered>) {
        self.delivered = Some(delivered);
    }
}

/// A node whose result is a function of two parents' batches at the same time.
pub(crate) struct BinaryNode<A, B, U, F> {
    pub(crate) left: Arc<Slot<A>>,
    pub(crate) right: Arc<Slot<B>>,
    pub(crate) output: Arc<Slot<U>>,
    pub(crate) f: F,
}

impl<A, B, U, F> Node for BinaryNode<A, B, U, F>
where
    A: Clone + Send + Sync,
    B: Clone + Send + Sync,
    U: Clone + Send + Sync,
    F: FnMut(Batch<A>, Batch<B>, &StepCtx<'_>) -> Result<Batch<U>, DStreamError> + Send,
{
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let left = ctx.take_owned(&self.left)?;
        let right = ctx.take_owned(&self.right)?;
        let result = match (left, right) {
            (Some(a), Some(b)) => Some((self.f)(a, b, ctx)?),
            (Some(a), None) => Some((self.f)(a, Batch::default(), ctx)?),
            (None, Some(b)) => Some((self.f)(Batch::default(), b, ctx)?),
            (None, None) => None,
        };
        self.output.put(ctx.time, result);
        Ok(None)
    }
}
