//! Windowed operators.
//!
//! A window of length `L` sliding by `S` produces, at every time `t` that
//! is a multiple of `S`, the result over the batches with times in
//! `(t - L, t]`. Slide times are absolute multiples of `S`, so they do not
//! move when a graph restarts.
//!
//! Three strategies, each keeping exactly the data its future windows need
//! (and dropping the rest), and each checkpointed as data:
//!
//! - [`DStream::window`] keeps the batches themselves.
//! - With an inverse function (Spark's `ReducedWindowedDStream`), the window's
//!   per-key result is updated in place: each slide adds the batches that
//!   entered and subtracts (with the inverse) the batches that left, so a
//!   slide costs the batches moved, not the whole window. Its state is
//!   compact and snapshot by what changed (see [`crate::inverse_window`]).
//! - Without an inverse, for an associative function, batches are combined
//!   into panes of `gcd(L, S)`, and the panes of the window sit in a
//!   two-stack queue: the back stack keeps a running aggregate, the front
//!   stack keeps suffix aggregates, rebuilt from the back when it runs dry.
//!   A slide costs O(keys) amortized, whatever `L / S` is. Its panes are
//!   compact too (see [`crate::pane_window`]).
//!
//! The two by-key windows reduce each batch by key before it enters the
//! window; right after a fed input (or a chain of partition-local operators
//! from one), that reduction runs on each block as it arrives (see
//! [`crate::arrival`]).

use std::collections::VecDeque;
use std::sync::Arc;

use spate_core::{CoreError, Duration, Time};

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::graph::Job;
use crate::inverse_window::{InverseWindow, InverseWindowNode};
use crate::node::{Node, NodeMeta, Slot, StateMeta, StatefulNode, StepCtx, state_codec};
use crate::pair::KeyedCombine;
use crate::pane_window::PaneWindowNode;
use crate::stream::DStream;

/// True when `time` is a slide time of a window sliding by `slide`.
fn is_slide_time(time: Time, slide: Duration) -> bool {
    time.is_multiple_of(slide)
}

// ---------------------------------------------------------------------------
// window(length, slide)

struct WindowNode<T> {
    input: Arc<Slot<T>>,
    output: Arc<Slot<T>>,
    length: Duration,
    slide: Duration,
    retained: VecDeque<(Time, Vec<Vec<T>>)>,
}

impl<T: Data> Node for WindowNode<T> {
    fn step(&mut self, ctx: &StepCtx<'_>) -> Result<Option<Job>, DStreamError> {
        if let Some(batch) = ctx.take_owned(&self.input)? {
            self.retained.push_back((ctx.time, batch.into_partitions()));
        }
        let cutoff = ctx.time - self.length;
        while self.retained.front().is_some_and(|(time, _)| *time <= cutoff) {
            self.retained.pop_front();
        }
        let result = is_slide_time(ctx.time, self.slide).then(|| {
            let mut partitions = Vec::new();
            for (_, parts) in &self.retained {
                partitions.extend(parts.iter().cloned());
            }
            Batch::new(partitions)
        });
        self.output.put(ctx.time, result);
        Ok(None)
    }

    fn state_mut(&mut self) -> Option<&mut dyn StatefulNode> {
        Some(self)
    }
}

impl<T: Data> StatefulNode for WindowNode<T> {
    fn snapshot(&mut self) -> Result<Vec<u8>, CoreError> {
        state_codec().encode(&self.retained)
    }

    fn restore(&mut self, bytes: &[u8], _partitions: usize) -> Result<(), CoreError> {
        self.retained = state_codec().decode(bytes)?.value;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The public operators.

fn window_meta(kind: &'static str, parent: usize, length: Duration, slide: Duration, state: StateMeta) -> NodeMeta {
    let mut meta = NodeMeta::new(kind, vec![parent], slide);
    meta.window = Some((length, slide));
    meta.state = Some(state);
    meta
}

impl<T: Data> DStream<T> {
    /// The records of the batches in `(t - length, t]`, at every multiple `t` of `slide`.
    pub fn window(&self, length: Duration, slide: Duration) -> DStream<T> {
        let input = self.reader();
        let state = StateMeta {
            key_type: None,
            value_type: std::any::type_name::<T>(),
            state_type: std::any::type_name::<T>(),
            needs_checkpoint: false,
        };
        let meta = window_meta("window", self.id, length, slide, state);
        self.add_node(meta, |output| Box::new(WindowNode { input, output, length, slide, retained: VecDeque::new() }))
    }

    /// Reduces all records of each window to one (no record for an empty
    /// window), with an associative and commutative `reduce`. Incremental:
    /// panes in a two-stack queue.
    pub fn reduce_by_window<F>(&self, reduce: F, length: Duration, slide: Duration) -> DStream<T>
    where
        F: Fn(&T, &T) -> T + Send + Sync + 'static,
    {
        let windowed = self.map(|record| ((), record)).reduce_by_key_and_window(reduce, length, slide);
        let target = windowed.name_target;
        let mut out = windowed.map(|(_, value)| value).rename_kind("reduce_by_window");
        out.name_target = target;
        out
    }

    /// Like [`DStream::reduce_by_window`], updating the window with
    /// `inverse` as batches leave (needs a checkpoint directory).
    pub fn reduce_by_window_inv<F, G>(&self, reduce: F, inverse: G, length: Duration, slide: Duration) -> DStream<T>
    where
        F: Fn(&T, &T) -> T + Send + Sync + 'static,
        G: Fn(&T, &T) -> T + Send + Sync + 'static,
    {
        let windowed = self.map(|record| ((), record)).reduce_by_key_and_window_inv(reduce, inverse, length, slide);
        let target = windowed.name_target;
        let mut out = windowed.map(|(_, value)| value).rename_kind("reduce_by_window_inv");
        out.name_target = target;
        out
    }

    /// The number of records in each window (one record, 0 for a window
    /// with no records).
    pub fn count_by_window(&self, length: Duration, slide: Duration) -> DStream<u64> {
        let windowed = self.count().map(|count| ((), count)).reduce_by_key_and_window(|a, b| a + b, length, slide);
        let target = windowed.name_target;
        let mut out = windowed.map(|(_, count)| count).rename_kind("count_by_window");
        out.name_target = target;
        out
    }
}

impl<T: Key> DStream<T> {
    /// How often each distinct record occurs in each window (panes, no
    /// checkpoint directory needed).
    pub fn count_by_value_and_window(&self, length: Duration, slide: Duration) -> DStream<(T, u64)> {
        let counts = self.count_by_value().reduce_by_key_and_window(|a, b| a + b, length, slide);
        counts.rename_kind("count_by_value_and_window")
    }
}

impl<K: Key, V: Data> DStream<(K, V)> {
    /// Gathers each key's values over each window.
    pub fn group_by_key_and_window(&self, length: Duration, slide: Duration) -> DStream<(K, Vec<V>)> {
        let windowed = self.window(length, slide);
        let target = windowed.name_target;
        let mut out = windowed.group_by_key();
        out.name_target = target;
        out
    }

    /// Reduces each key's values over each window with an associative and
    /// commutative `reduce`. Each slide costs O(keys) amortized, however
    /// long the window is relative to the slide.
    pub fn reduce_by_key_and_window<F>(&self, reduce: F, length: Duration, slide: Duration) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        let input = self.reader();
        let state = StateMeta {
            key_type: Some(std::any::type_name::<K>()),
            value_type: std::any::type_name::<V>(),
            state_type: std::any::type_name::<V>(),
            needs_checkpoint: false,
        };
        let meta = window_meta("reduce_by_key_and_window", self.id, length, slide, state);
        let reduce = Arc::new(reduce);
        let combine = KeyedCombine::reducing(Arc::clone(&reduce));
        self.add_node(meta, |output| Box::new(PaneWindowNode::new(input, output, reduce, combine, length, slide)))
    }

    /// Reduces each key's values over each window incrementally: each slide
    /// adds the batches that entered with `reduce` and removes those that
    /// left with `inverse` (`inverse(reduce(a, b), b) == a`). Keys stay
    /// with their "zero" value once their batches left; see
    /// [`DStream::reduce_by_key_and_window_inv_filtered`]. Needs a checkpoint directory.
    pub fn reduce_by_key_and_window_inv<F, G>(
        &self,
        reduce: F,
        inverse: G,
        length: Duration,
        slide: Duration,
    ) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
        G: Fn(&V, &V) -> V + Send + Sync + 'static,
    {
        self.inverse_window(reduce, inverse, length, slide, None::<fn(&K, &V) -> bool>)
    }

    /// Like [`DStream::reduce_by_key_and_window_inv`], keeping in the window
    /// only the keys for which `keep` is true (for example, dropping keys
    /// whose count returned to zero).
    pub fn reduce_by_key_and_window_inv_filtered<F, G, P>(
        &self,
        reduce: F,
        inverse: G,
        length: Duration,
        slide: Duration,
        keep: P,
    ) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
        G: Fn(&V, &V) -> V + Send + Sync + 'static,
        P: Fn(&K, &V) -> bool + Send + Sync + 'static,
    {
        self.inverse_window(reduce, inverse, length, slide, Some(keep))
    }

    /// The inverse window, keeping the keys `keep` passes (`None`: all).
    fn inverse_window<F, G, P>(
        &self,
        reduce: F,
        inverse: G,
        length: Duration,
        slide: Duration,
        keep: Option<P>,
    ) -> DStream<(K, V)>
    where
        F: Fn(&V, &V) -> V + Send + Sync + 'static,
        G: Fn(&V, &V) -> V + Send + Sync + 'static,
        P: Fn(&K, &V) -> bool + Send + Sync + 'static,
    {
        let input = self.reader();
        let state = StateMeta {
            key_type: Some(std::any::type_name::<K>()),
            value_type: std::any::type_name::<V>(),
            state_type: std::any::type_name::<V>(),
            needs_checkpoint: true,
        };
        let meta = window_meta("reduce_by_key_and_window_inv", self.id, length, slide, state);
        let spec = InverseWindow { reduce, inverse, keep, length, slide, input_reduced: self.keys_partitioned() };
        self.add_node(meta, |output| Box::new(InverseWindowNode::new(input, output, spec)))
    }
}
