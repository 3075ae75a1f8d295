//! What the query tests share: the generated source of a run, a pipeline
//! run on a manual clock batch by batch (across restarts on one
//! checkpoint), what each output wrote by batch, and the checks of each
//! batch's rows against a reference worked out from the delivered events.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use spate_core::{BatchId, Duration, ManualClock};
use spate_dstream::{DStream, Data};
use spate_nexmark::queries;
use spate_nexmark::{Event, GeneratorSettings, NexmarkGenerator, NexmarkSource};
use spate_runtime::{PipelineBuilder, RecoveryReport, StreamingContext, StreamingSettings};

pub const WAIT: StdDuration = StdDuration::from_secs(120);
pub const START: i64 = 1_700_000_000_000;
pub const EVENTS: u64 = 40_000;
/// 1,000 events a second: 40 s of events, 40 one-second batches.
pub const RATE: f64 = 1_000.0;
/// Batches to run: the 40 with events and two after them.
pub const BATCHES: u64 = 42;

/// How the source of a run is set up.
#[derive(Clone, Copy)]
pub struct Setup {
    pub seed: u64,
    pub partitions: usize,
    /// Events are shuffled within groups of this many (1: in order).
    pub out_of_order_group: u32,
}

/// The events in order, from three partitions.
pub const IN_ORDER: Setup = Setup { seed: 7, partitions: 3, out_of_order_group: 1 };

impl Setup {
    fn config(&self) -> GeneratorSettings {
        GeneratorSettings::new(self.seed, START)
            .with_rate(RATE)
            .with_max_events(EVENTS)
            .with_out_of_order_group_size(self.out_of_order_group)
    }

    pub fn source(&self) -> Arc<NexmarkSource> {
        let generator = NexmarkGenerator::new(self.config()).unwrap();
        Arc::new(NexmarkSource::new(generator).with_partitions(self.partitions))
    }

    pub fn events(&self) -> Vec<Event> {
        NexmarkGenerator::new(self.config()).unwrap().events(0..EVENTS)
    }
}

/// Rows by batch; a batch run again replaces what it wrote before.
pub type Sink<T> = Arc<Mutex<BTreeMap<u64, Vec<T>>>>;

/// Each batch's events, partition by partition.
pub type Delivered = BTreeMap<u64, Vec<Vec<Event>>>;

/// Records what `stream` writes in each batch into `sink`.
pub fn record<T: Data>(stream: &DStream<T>, name: &str, sink: &Sink<T>) {
    let sink = Arc::clone(sink);
    stream
        .foreach_batch(move |batch, info| {
            sink.lock().unwrap().insert(info.batch_id.0, batch.iter().cloned().collect());
            Ok(())
        })
        .name(name);
}

/// The source's event stream, each batch's events recorded into `events`
/// and its time (ms) into `times`.
pub fn nexmark_events(
    p: &mut PipelineBuilder,
    source: &Arc<NexmarkSource>,
    events: &Arc<Mutex<Delivered>>,
    times: &Arc<Mutex<BTreeMap<u64, i64>>>,
) -> DStream<Event> {
    let stream = p.replayable_input("nexmark", Arc::clone(source), Some(source.resume_hook()), None);
    let (sink, times) = (Arc::clone(events), Arc::clone(times));
    stream
        .foreach_batch(move |batch, info| {
            sink.lock().unwrap().insert(info.batch_id.0, batch.partitions().to_vec());
            times.lock().unwrap().insert(info.batch_id.0, info.time.as_millis());
            Ok(())
        })
        .name("events");
    stream
}

/// How a run ends: a graceful stop also snapshots the state of its last
/// batch; an immediate one leaves the last snapshot where the interval put it.
#[derive(Clone, Copy)]
pub enum Stop {
    Graceful,
    Now,
}

/// Runs `batches` in a new context (a new process, as far as the pipeline
/// can tell) on `dir`, one second of the clock each, its pipeline declared
/// by `declare` on the source of `setup`; returns what the context
/// recovered from the checkpoint.
pub fn run(
    dir: &Path,
    clock: &ManualClock,
    setup: Setup,
    batches: std::ops::Range<u64>,
    stop: Stop,
    declare: impl Fn(&mut PipelineBuilder, &Arc<NexmarkSource>),
) -> Option<RecoveryReport> {
    let source = setup.source();
    let settings = StreamingSettings::new(Duration::from_secs(1)).with_clock(Arc::new(clock.clone()));
    let mut ctx = StreamingContext::get_or_create(dir, settings, |p| {
        declare(p, &source);
        Ok(())
    })
    .unwrap();
    let recovery = ctx.recovery().cloned();
    ctx.start().unwrap();
    for batch in batches {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), WAIT), "batch {batch}: {:?}", ctx.failure());
    }
    match stop {
        Stop::Graceful => ctx.stop_handle().stop_gracefully(),
        Stop::Now => ctx.stop_handle().stop_now(),
    }
    ctx.await_termination().unwrap();
    recovery
}

/// Each batch's events as the run delivered them, after checking that they
/// are the generator's events, each once, in order, and every batch once
/// from 0 (a run after a re-run may get one batch further).
pub fn delivered(events: &Arc<Mutex<Delivered>>, setup: Setup) -> Delivered {
    let events = events.lock().unwrap().clone();
    let batches: Vec<u64> = events.keys().copied().collect();
    assert!(batches.len() as u64 >= BATCHES, "{batches:?}");
    assert_eq!(batches, (0..batches.len() as u64).collect::<Vec<_>>());
    let flat: Vec<&Event> = events.values().flatten().flatten().collect();
    let expected = setup.events();
    assert!(flat.len() == expected.len() && flat.iter().zip(&expected).all(|(a, b)| *a == b));
    events
}

/// The watermark after each batch of an operator whose input holds the
/// events `keep` selects, in the source's partitions: per partition the
/// largest event time so far, the smallest of these (once every partition
/// has delivered) minus the bound, never going back.
pub fn watermarks(events: &Delivered, keep: fn(&Event) -> bool) -> BTreeMap<u64, Option<i64>> {
    let bound = queries::OUT_OF_ORDERNESS.as_millis() as i64;
    let mut largest: Vec<Option<i64>> = Vec::new();
    let mut watermark: Option<i64> = None;
    let mut out = BTreeMap::new();
    for (batch, parts) in events {
        largest.resize(largest.len().max(parts.len()), None);
        for (slot, part) in largest.iter_mut().zip(parts) {
            let max = part.iter().filter(|e| keep(e)).map(Event::timestamp_ms).max();
            *slot = (*slot).max(max);
        }
        if let Some(lowest) = largest.iter().copied().collect::<Option<Vec<i64>>>().and_then(|v| v.into_iter().min()) {
            watermark = watermark.max(Some(lowest - bound));
        }
        out.insert(*batch, watermark);
    }
    out
}

/// The first batch whose watermark reaches `time`.
pub fn first_batch_reaching(watermarks: &BTreeMap<u64, Option<i64>>, time: i64) -> Option<u64> {
    watermarks.iter().find(|(_, w)| w.is_some_and(|w| w >= time)).map(|(b, _)| *b)
}

/// The rows of each batch, sorted, leaving out batches without any.
pub fn by_batch<T: Ord + Clone>(rows: &BTreeMap<u64, Vec<T>>) -> BTreeMap<u64, Vec<T>> {
    rows.iter()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(batch, rows)| {
            let mut rows = rows.clone();
            rows.sort();
            (*batch, rows)
        })
        .collect()
}

/// Asserts that `got` has the reference's rows in the reference's batches,
/// and that there are at least `at_least` of them.
pub fn check<T: Ord + Clone + Debug>(query: &str, got: &Sink<T>, expected: BTreeMap<u64, Vec<T>>, at_least: usize) {
    let got = by_batch(&got.lock().unwrap());
    let expected = by_batch(&expected);
    let count: usize = expected.values().map(Vec::len).sum();
    assert!(count >= at_least, "{query}: only {count} reference rows, the check would be weak");
    for batch in got.keys().chain(expected.keys()).collect::<BTreeSet<_>>() {
        let (g, e) = (got.get(batch), expected.get(batch));
        if g != e {
            let (g, e) = (g.cloned().unwrap_or_default(), e.cloned().unwrap_or_default());
            let missing: Vec<&T> = e.iter().filter(|r| !g.contains(r)).take(3).collect();
            let extra: Vec<&T> = g.iter().filter(|r| !e.contains(r)).take(3).collect();
            panic!(
                "{query}: batch {batch}: {} rows, the reference {}; missing {missing:?}, not in the reference {extra:?}",
                g.len(),
                e.len()
            );
        }
    }
}
