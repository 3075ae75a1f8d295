//! Building a graph from code, validating it, and running it batch by batch.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use spate_core::{BatchId, Duration, Time};

use crate::arrival::{ArrivalStage, ArrivalStep};
use crate::batch::Data;
use crate::error::{BoxError, DStreamError, GraphProblem};
use crate::node::{Node, NodeMeta, PlannedOffsets, Slot, StepCtx};
use crate::pool::Pool;
use crate::source::{BatchLimits, InputSource, SourceContext};
use crate::spill::StateSpill;
use crate::stream::DStream;

/// The batch an output job writes: its time and id, so sinks can be idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BatchInfo {
    /// The batch time.
    pub time: Time,
    /// The batch id.
    pub batch_id: BatchId,
}

/// One output's work for one batch, ready to run.
pub struct Job {
    pub(crate) output: String,
    pub(crate) info: BatchInfo,
    pub(crate) run: Box<dyn FnOnce() -> (Result<(), DStreamError>, Released) + Send>,
}

/// The records an output job read, handed back by [`Job::run_and_release`]
/// to be freed once the job's outcome is reported: freeing a million
/// records takes tens of milliseconds that the batch need not wait for.
/// Dropping it frees them.
pub struct Released(#[allow(dead_code, reason = "held to be dropped")] Box<dyn Send>);

impl fmt::Debug for Released {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Released")
    }
}

impl Released {
    /// Holds `records` until this is dropped.
    pub fn new<T: Send + 'static>(records: T) -> Self {
        Released(Box::new(records))
    }
}

impl Job {
    /// The name of the output operation.
    pub fn output(&self) -> &str {
        &self.output
    }

    /// The batch this job writes.
    pub fn batch(&self) -> BatchInfo {
        self.info
    }

    /// Runs the output operation.
    pub fn run(self) -> Result<(), DStreamError> {
        self.run_and_release().0
    }

    /// Runs the output operation and hands back the records it read,
    /// for the caller to free after it has passed the outcome on.
    pub fn run_and_release(self) -> (Result<(), DStreamError>, Released) {
        (self.run)()
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job").field("output", &self.output).field("batch", &self.info).finish_non_exhaustive()
    }
}

/// An input of a built graph, as the runtime sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputInfo {
    /// The input's stable name (the key of its offsets in the offset log).
    pub name: String,
    /// True when the input plans offsets and can replay them.
    pub replayable: bool,
}

/// The type-erased planning half of an input source.
trait Planner: Send + Sync {
    fn replayable(&self) -> bool;
    fn register(&self, context: &SourceContext) -> Result<(), BoxError>;
    fn plan(&self, time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError>;
}

struct ErasedSource<T>(Arc<dyn InputSource<T>>);

impl<T> Planner for ErasedSource<T> {
    fn replayable(&self) -> bool {
        self.0.is_replayable()
    }
    fn register(&self, context: &SourceContext) -> Result<(), BoxError> {
        self.0.register(context)
    }
    fn plan(&self, time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError> {
        self.0.plan(time, limits)
    }
}

struct InputNode<T> {
    source: Arc<dyn InputSource<T>>,
    output: Arc<Slot<T>>,
}

impl<T: Data> Node for InputNode<T> {
    fn offer_arrival_stage(&mut self, stage: Box<dyn std::any::Any>, steps: &[ArrivalStep]) -> Option<usize> {
        let stage = stage.downcast::<ArrivalStage<T>>().ok()?;
        // The longest chain the source takes: a Kafka stream takes only a
        // chunkable one.
        (0..=steps.len()).rev().find(|&taken| {
            let chain = steps[..taken].iter().fold((*stage).clone(), |chain, step| chain.then(step));
            self.source.set_arrival_stage(chain)
        })
    }

    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        let planned = ctx.planned.get(ctx.operator).map(String::as_str);
        if self.source.is_replayable() && planned.is_none() {
            return Err(DStreamError::MissingPlan { input: ctx.operator.to_string(), time: ctx.time });
        }
        let partitions = self.source.compute(ctx.time, planned).map_err(|source| DStreamError::Source {
            input: ctx.operator.to_string(),
            time: ctx.time,
            source,
        })?;
        self.output.put(ctx.time, Some(crate::batch::Batch::new(partitions)));
        Ok(None)
    }
}

/// Nodes and their metadata while the graph is being built.
pub(crate) struct BuilderInner {
    pub(crate) batch_interval: Duration,
    pub(crate) nodes: Vec<Box<dyn Node>>,
    pub(crate) metas: Vec<NodeMeta>,
    planners: Vec<(usize, Arc<dyn Planner>)>,
}

impl BuilderInner {
    /// Adds a node and returns its index.
    pub(crate) fn push(&mut self, meta: NodeMeta, node: Box<dyn Node>) -> usize {
        self.nodes.push(node);
        self.metas.push(meta);
        self.metas.len() - 1
    }
}

pub(crate) type SharedBuilder = Rc<RefCell<BuilderInner>>;

/// Builds a [`Graph`]: declare inputs, transform the streams, register
/// outputs, then [`GraphBuilder::build`] validates and returns the graph.
pub struct GraphBuilder {
    inner: SharedBuilder,
    checkpointing: bool,
    partitions: Option<usize>,
    workers: Option<usize>,
}

impl GraphBuilder {
    /// A builder for a graph with batches every `batch_interval`.
    pub fn new(batch_interval: Duration) -> Self {
        GraphBuilder {
            inner: Rc::new(RefCell::new(BuilderInner {
                batch_interval,
                nodes: Vec::new(),
                metas: Vec::new(),
                planners: Vec::new(),
            })),
            checkpointing: false,
            partitions: None,
            workers: None,
        }
    }

    /// Says whether a checkpoint directory is configured; stateful operators
    /// and inverse windows are refused without one.
    pub fn checkpointing(mut self, configured: bool) -> Self {
        self.checkpointing = configured;
        self
    }

    /// The number of partitions shuffles produce (default: the number of cores).
    pub fn partitions(mut self, partitions: usize) -> Self {
        self.partitions = Some(partitions.max(1));
        self
    }

    /// The number of worker threads (default: the number of cores).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = Some(workers.max(1));
        self
    }

    /// The batch interval.
    pub fn batch_interval(&self) -> Duration {
        self.inner.borrow().batch_interval
    }

    /// Declares an input stream named `name` that reads from `source`.
    pub fn input<T: Data, S: InputSource<T> + 'static>(&self, name: &str, source: Arc<S>) -> DStream<T> {
        self.input_dyn(name, source)
    }

    /// Like [`GraphBuilder::input`], for a source already behind `dyn InputSource`.
    pub fn input_dyn<T: Data>(&self, name: &str, source: Arc<dyn InputSource<T>>) -> DStream<T> {
        let slot = Slot::new();
        let mut inner = self.inner.borrow_mut();
        let interval = inner.batch_interval;
        let mut meta = NodeMeta::new("input", Vec::new(), interval);
        meta.name = Some(name.to_string());
        meta.input = true;
        let node = InputNode { source: Arc::clone(&source), output: Arc::clone(&slot) };
        let id = inner.push(meta, Box::new(node));
        inner.planners.push((id, Arc::new(ErasedSource(source))));
        drop(inner);
        DStream::from_parts(Rc::clone(&self.inner), id, slot, interval)
    }

    /// Validates the graph and returns it, or every problem found.
    pub fn build(self) -> Result<Graph, DStreamError> {
        let inner = Rc::try_unwrap(self.inner).map(RefCell::into_inner).unwrap_or_else(|shared| {
            // Streams still alive hold the builder; take the nodes out of it.
            let mut borrowed = shared.borrow_mut();
            BuilderInner {
                batch_interval: borrowed.batch_interval,
                nodes: std::mem::take(&mut borrowed.nodes),
                metas: std::mem::take(&mut borrowed.metas),
                planners: std::mem::take(&mut borrowed.planners),
            }
        });
        let names = resolve_names(&inner.metas);
        let problems = validate(&inner, &names, self.checkpointing);
        if !problems.is_empty() {
            return Err(DStreamError::InvalidGraph { problems });
        }
        for (meta, name) in inner.metas.iter().zip(&names) {
            if meta.state.is_some() && meta.name.is_none() {
                tracing::warn!(
                    operator = %name,
                    "stateful operator has no explicit name; its state is matched by its position in the graph, \
                     so upgrades that add or move operators need an explicit .name()"
                );
            }
        }
        let mut inner = inner;
        fuse_arrival_stages(&mut inner, &names);
        let pool = self.workers.map_or_else(Pool::for_machine, Pool::new);
        let partitions = self.partitions.unwrap_or(pool.workers());
        hand_over_combined_blocks(&mut inner, partitions);
        pick_greatest_where_listed(&mut inner);
        let inputs = inner
            .planners
            .into_iter()
            .filter_map(|(id, planner)| names.get(id).map(|name| (name.clone(), planner)))
            .collect();
        let feeds_state = feeds_state(&inner.metas);
        Ok(Graph {
            batch_interval: inner.batch_interval,
            nodes: inner.nodes,
            feeds_state,
            metas: inner.metas,
            names,
            inputs,
            partitions,
            pool,
            last_time: None,
            late_records: 0,
        })
    }
}

/// For each node, whether a stateful operator reads its result, directly
/// or through other operators: what recomputing a batch for state alone
/// needs (nodes come after their parents).
fn feeds_state(metas: &[NodeMeta]) -> Vec<bool> {
    let mut feeds = vec![false; metas.len()];
    for (index, meta) in metas.iter().enumerate().rev() {
        let needed = meta.state.is_some() || feeds.get(index).copied().unwrap_or(false);
        if needed {
            for parent in &meta.parents {
                if let Some(slot) = feeds.get_mut(*parent) {
                    *slot = true;
                }
            }
        }
    }
    feeds
}

impl fmt::Debug for GraphBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphBuilder").field("checkpointing", &self.checkpointing).finish_non_exhaustive()
    }
}

/// Hands the function of each input's only consumer, when that consumer is
/// partition-local or a per-key aggregate, to the input's source to run on
/// blocks as they arrive (see [`crate::arrival`]), followed by the chain of
/// operators each reading the one before as its only reader, as long as
/// they are partition-local (an aggregate ends it); sources that do not
/// take one keep computing them at the batch boundary.
fn fuse_arrival_stages(inner: &mut BuilderInner, names: &[String]) {
    let inputs: Vec<usize> = (0..inner.metas.len()).filter(|&i| inner.metas[i].input).collect();
    for input in inputs {
        let Some(consumer) = only_reader(inner, input) else { continue };
        let Some(name) = names.get(consumer) else { continue };
        let Some((stage, delivered)) = inner.nodes[consumer].arrival_stage(name) else { continue };
        let mut chain: Vec<(usize, ArrivalStep)> = Vec::new();
        let mut last = consumer;
        while inner.metas[last].partition_local
            && let Some(next) = only_reader(inner, last)
        {
            let Some(step) = names.get(next).and_then(|name| inner.nodes[next].arrival_step(name)) else { break };
            chain.push((next, step));
            last = next;
        }
        let steps: Vec<ArrivalStep> = chain.iter().map(|(_, step)| step.clone()).collect();
        match inner.nodes[input].offer_arrival_stage(stage, &steps) {
            Some(0) => inner.nodes[consumer].take_delivered(delivered),
            Some(taken) => {
                let (node, step) = &chain[taken - 1];
                inner.nodes[*node].take_delivered(Arc::clone(&step.delivered));
            }
            None => {}
        }
    }
}

/// Hands the blocks a per-key aggregate combined on arrival to the only
/// reader of its result, when that reader merges them itself (a window
/// over `reduce_by_key`'s result; see [`crate::pair::CombinedBlocks`]).
fn hand_over_combined_blocks(inner: &mut BuilderInner, partitions: usize) {
    for reader in 0..inner.nodes.len() {
        let [aggregate] = inner.metas[reader].parents[..] else { continue };
        if only_reader(inner, aggregate) != Some(reader) {
            continue;
        }
        let Some(blocks) = inner.nodes[aggregate].combined_hand_over() else { continue };
        if inner.nodes[reader].take_combined(blocks) {
            inner.nodes[aggregate].combined_handed_over(partitions);
        }
    }
}

/// Lets the operator whose result only a [`DStream::top_n`](crate::DStream)
/// reads list just each partition's greatest records.
fn pick_greatest_where_listed(inner: &mut BuilderInner) {
    for reader in 0..inner.nodes.len() {
        let [producer] = inner.metas[reader].parents[..] else { continue };
        if only_reader(inner, producer) != Some(reader) {
            continue;
        }
        if let Some(greatest) = inner.nodes[reader].greatest_wanted() {
            inner.nodes[producer].list_only_greatest(greatest);
        }
    }
}

/// The only reader of `node`, when it has exactly one.
fn only_reader(inner: &BuilderInner, node: usize) -> Option<usize> {
    let mut readers = inner.metas.iter().enumerate().filter(|(_, m)| m.parents.contains(&node)).map(|(i, _)| i);
    let (reader, None) = (readers.next()?, readers.next()) else { return None };
    (inner.metas[node].consumers == 1).then_some(reader)
}

/// Explicit names, or `<kind>-<position>` for nodes without one.
fn resolve_names(metas: &[NodeMeta]) -> Vec<String> {
    metas
        .iter()
        .enumerate()
        .map(|(index, meta)| meta.name.clone().unwrap_or_else(|| format!("{}-{index}", meta.kind)))
        .collect()
}

fn validate(inner: &BuilderInner, names: &[String], checkpointing: bool) -> Vec<GraphProblem> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for name in names {
        if name.is_empty() || name.contains('/') || name.contains('\\') || name.contains("..") {
            problems.push(GraphProblem::BadName { name: name.clone() });
        }
        if !seen.insert(name.as_str()) {
            problems.push(GraphProblem::DuplicateName { name: name.clone() });
        }
    }
    if !inner.metas.iter().any(|meta| meta.is_output) {
        problems.push(GraphProblem::NoOutputs);
    }
    let interval = inner.batch_interval;
    for (meta, name) in inner.metas.iter().zip(names) {
        if !meta.is_output && meta.consumers == 0 && !meta.may_go_unread {
            problems.push(GraphProblem::NoOutput { operator: name.clone() });
        }
        if let Some((window, slide)) = meta.window {
            for (which, duration) in [("window", window), ("slide", slide)] {
                if !duration.is_multiple_of(interval) {
                    let operator = name.clone();
                    problems.push(GraphProblem::WindowNotMultiple {
                        operator,
                        which,
                        duration,
                        batch_interval: interval,
                    });
                }
            }
        }
        if let Some(reason) = &meta.event_time_problem {
            problems.push(GraphProblem::BadEventWindows { operator: name.clone(), reason: reason.clone() });
        }
        if meta.state.as_ref().is_some_and(|state| state.needs_checkpoint) && !checkpointing {
            problems.push(GraphProblem::NeedsCheckpoint { operator: name.clone(), kind: meta.kind });
        }
        let slides: Vec<Duration> = meta.parents.iter().filter_map(|p| inner.metas.get(*p)).map(|p| p.slide).collect();
        if slides.windows(2).any(|pair| pair[0] != pair[1]) {
            problems.push(GraphProblem::SlideMismatch { operator: name.clone(), slides });
        }
    }
    problems
}

/// A validated stream graph. The runtime drives it batch by batch:
/// [`Graph::plan`] before the batch (its result goes to the offset log),
/// then [`Graph::generate_jobs`] and running every job, in increasing batch
/// time. State is checkpointed with [`Graph::descriptor`] and
/// [`Graph::snapshot_state`] and brought back with [`Graph::restore`].
///
/// When `generate_jobs` or a job fails, operators may have advanced part of
/// the way; restore the graph from the last checkpoint before going on.
pub struct Graph {
    pub(crate) batch_interval: Duration,
    pub(crate) nodes: Vec<Box<dyn Node>>,
    /// By node: whether a stateful operator reads its result (see [`feeds_state`]).
    feeds_state: Vec<bool>,
    pub(crate) metas: Vec<NodeMeta>,
    pub(crate) names: Vec<String>,
    inputs: Vec<(String, Arc<dyn Planner>)>,
    pub(crate) partitions: usize,
    pool: Pool,
    last_time: Option<Time>,
    /// Records the last batch generated set aside as late.
    late_records: u64,
}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("batch_interval", &self.batch_interval)
            .field("operators", &self.names)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl Graph {
    /// The batch interval.
    pub fn batch_interval(&self) -> Duration {
        self.batch_interval
    }

    /// The names of every operator, inputs and outputs included, in graph order.
    pub fn operator_names(&self) -> &[String] {
        &self.names
    }

    /// The inputs, in declaration order.
    pub fn inputs(&self) -> Vec<InputInfo> {
        self.inputs
            .iter()
            .map(|(name, planner)| InputInfo { name: name.clone(), replayable: planner.replayable() })
            .collect()
    }

    /// Tells every input what the streaming context says (see
    /// [`InputSource::register`]); the first refusal is the error.
    pub fn register_sources(&self, context: &SourceContext) -> Result<(), DStreamError> {
        for (name, planner) in &self.inputs {
            planner.register(context).map_err(|source| DStreamError::Source {
                input: name.clone(),
                time: Time::ZERO,
                source,
            })?;
        }
        Ok(())
    }

    /// Asks every input to plan batch `time`; `limits` holds the limits per
    /// input name (absent: unlimited). Returns the offsets of the
    /// replayable inputs, to be logged before the batch runs.
    pub fn plan(&self, time: Time, limits: &BTreeMap<String, BatchLimits>) -> Result<PlannedOffsets, DStreamError> {
        let mut planned = PlannedOffsets::new();
        for (name, planner) in &self.inputs {
            let limit = limits.get(name).copied().unwrap_or_default();
            let offsets = planner.plan(time, limit).map_err(|source| DStreamError::Source {
                input: name.clone(),
                time,
                source,
            })?;
            match offsets {
                Some(offsets) => {
                    planned.insert(name.clone(), offsets);
                }
                None if planner.replayable() => {
                    return Err(DStreamError::MissingPlan { input: name.clone(), time });
                }
                None => {}
            }
        }
        Ok(planned)
    }

    /// Computes batch `time` through every transformation and returns one
    /// job per output that has a result at this time (an output after a
    /// window runs only at the window's slide times). `planned` is what
    /// [`Graph::plan`] returned, or its logged copy on a re-run.
    pub fn generate_jobs(
        &mut self,
        time: Time,
        batch_id: BatchId,
        planned: &PlannedOffsets,
    ) -> Result<Vec<Job>, DStreamError> {
        self.step_all(time, batch_id, planned, false)
    }

    /// Computes batch `time` for the operators' state alone, as a restart
    /// does for the batches committed after the last snapshot: the state
    /// is the same as after [`Graph::generate_jobs`], no output runs, and a
    /// stateful operator that only outputs read (a window whose counts go
    /// to a sink) does not build its result.
    pub fn recompute_for_state(
        &mut self,
        time: Time,
        batch_id: BatchId,
        planned: &PlannedOffsets,
    ) -> Result<(), DStreamError> {
        self.step_all(time, batch_id, planned, true).map(drop)
    }

    fn step_all(
        &mut self,
        time: Time,
        batch_id: BatchId,
        planned: &PlannedOffsets,
        for_state: bool,
    ) -> Result<Vec<Job>, DStreamError> {
        if !time.is_multiple_of(self.batch_interval) {
            return Err(DStreamError::UnalignedBatchTime { time, interval: self.batch_interval });
        }
        if let Some(previous) = self.last_time.filter(|previous| time <= *previous) {
            return Err(DStreamError::TimeNotIncreasing { time, previous });
        }
        self.last_time = Some(time);
        let mut jobs = Vec::new();
        let late = AtomicU64::new(0);
        for ((node, name), feeds_state) in self.nodes.iter_mut().zip(&self.names).zip(&self.feeds_state) {
            let (pool, partitions, late) = (self.pool, self.partitions, &late);
            let result_wanted = !for_state || *feeds_state;
            let ctx = StepCtx { time, batch_id, pool, partitions, planned, operator: name, late, result_wanted };
            if let Some(job) = node.step(&ctx)? {
                jobs.push(job);
            }
        }
        self.late_records = late.into_inner();
        tracing::debug!(time = %time, batch = %batch_id, jobs = jobs.len(), for_state, "generated jobs");
        Ok(jobs)
    }

    /// Plans, computes and writes batch `time` in one call (what a runtime
    /// without an offset log, or a test, does). Returns the planned offsets.
    pub fn run_batch(&mut self, time: Time, batch_id: BatchId) -> Result<PlannedOffsets, DStreamError> {
        let planned = self.plan(time, &BTreeMap::new())?;
        for job in self.generate_jobs(time, batch_id, &planned)? {
            job.run()?;
        }
        Ok(planned)
    }

    /// How many records the last batch generated set aside as late: behind
    /// the watermark when every window they belonged to was gone, or
    /// stamped further ahead of the batch time than the watermarks allow.
    pub fn late_records(&self) -> u64 {
        self.late_records
    }

    /// Lets keyed state beyond `spill`'s budget move to its store:
    /// `map_with_state` moves a partition whose keys and states take more
    /// than its share of the budget to a table there. Call it before
    /// restoring state, so a restored state larger than the budget goes
    /// there as it is read.
    pub fn spill_state(&mut self, spill: &StateSpill) {
        for (node, name) in self.nodes.iter_mut().zip(&self.names) {
            if let Some(state) = node.state_mut() {
                state.use_spill(name, spill);
            }
        }
    }

    /// The time of the last batch generated, if any.
    pub fn last_batch_time(&self) -> Option<Time> {
        self.last_time
    }

    /// Declares that batches up to and including `time` are already in the
    /// restored state, so an attempt to run one of them again (which would
    /// count its records twice) is refused with [`DStreamError::TimeNotIncreasing`].
    pub fn resume_after(&mut self, time: Time) {
        self.last_time = Some(time);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use spate_core::Duration;

    use crate::{DStream, FedSource, GraphBuilder};

    /// Builds `job` over a fed input; true when `reduce_by_key-2` still
    /// merges the blocks it combined on arrival itself.
    fn aggregate_keeps_its_blocks(job: impl Fn(&DStream<(u32, u64)>)) -> bool {
        let builder = GraphBuilder::new(Duration::from_secs(1)).checkpointing(true);
        let words = builder.input("in", Arc::new(FedSource::<u32>::new()));
        job(&words.map(|w| (w % 7, 1u64)));
        let graph = builder.build().unwrap();
        let aggregate = graph.names.iter().position(|name| name == "reduce_by_key-2").unwrap();
        graph.nodes[aggregate].combined_hand_over().is_some()
    }

    #[test]
    fn a_window_reading_an_aggregate_alone_merges_its_blocks_itself() {
        let (length, slide) = (Duration::from_secs(3), Duration::from_secs(1));
        let window = move |counts: &DStream<(u32, u64)>| {
            counts.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, length, slide)
        };
        assert!(!aggregate_keeps_its_blocks(|pairs| {
            window(&pairs.reduce_by_key(|a, b| a + b)).print(1);
        }));
        // A second reader needs the aggregate's result whole.
        assert!(aggregate_keeps_its_blocks(|pairs| {
            let counts = pairs.reduce_by_key(|a, b| a + b);
            window(&counts).print(1);
            counts.print(1);
        }));
        // A window with no inverse merges nothing itself.
        assert!(aggregate_keeps_its_blocks(|pairs| {
            pairs.reduce_by_key(|a, b| a + b).reduce_by_key_and_window(|a, b| a + b, length, slide).print(1);
        }));
    }
}
