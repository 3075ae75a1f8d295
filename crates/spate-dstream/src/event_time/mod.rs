//! Event time: windows and timers by when things happened, not by the
//! batch that happened to read them.
//!
//! Every record of a keyed stream gets an event time from a function of
//! its value (a Kafka record's timestamp, a field of the event). Each
//! partition of the operator's input tracks the largest event time it has
//! seen; its watermark is that minus the bound on out-of-orderness
//! ([`Watermarks`]), and the stream's watermark is the minimum over the
//! partitions, so one lagging partition holds every window back instead of
//! having its records declared late. A partition without records for the
//! idle timeout (of batch time) stops counting, so an empty partition does
//! not stop the stream. The watermark never goes back.
//!
//! A batch first assigns its records (checked against the watermark the
//! batch started with), then advances the watermark with the batch's event
//! times, then emits: a window `[start, end)` is emitted once, when the
//! watermark reaches `end` (every record before `end` has arrived), and its
//! state is kept for the allowed lateness after that. A record behind the
//! watermark whose window is still kept updates it, and the window is
//! emitted again with the next [`WindowResult::revision`]; a record whose
//! windows are all gone goes to the late output, which the program can
//! read ([`EventTimeWindowed::late`]) and which is otherwise counted and
//! logged, never dropped silently.
//!
//! So, when no record is later than the bound, what is emitted depends
//! only on the events and not on the batch interval or on how records fall
//! into batches (a property test checks this, with crashes and restores).
//! Batch time stays the unit of progress and recovery: the watermarks and
//! the open windows are operator state, checkpointed with the batch,
//! matched by operator name on upgrade and restored exactly.
//!
//! Partitions are those of the operator's input: the source's partitions
//! when only per-record operators (`map`, `filter`, …) lie between the
//! source and the window, as with a Kafka direct stream (one partition per
//! topic partition) or the Nexmark source.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use spate_core::{BatchId, Duration, Time};
//! use spate_dstream::{EventWindows, GraphBuilder, QueueSource, Watermarks};
//!
//! let builder = GraphBuilder::new(Duration::from_secs(1)).checkpointing(true);
//! // (page, event time in ms)
//! let clicks = Arc::new(QueueSource::<(String, i64)>::new());
//! let per_page = builder
//!     .input("clicks", Arc::clone(&clicks))
//!     .aggregate_by_event_time(
//!         |at: &i64| Time::from_millis(*at),
//!         Watermarks::bounded_out_of_orderness(Duration::from_millis(500)),
//!         EventWindows::tumbling(Duration::from_secs(10)),
//!         |_| 1u64,
//!         |n: &mut u64, _| *n += 1,
//!         |n: &mut u64, m: &u64| *n += m,
//!     )
//!     .name("clicks-per-page");
//! let emitted = Arc::new(Mutex::new(Vec::new()));
//! let sink = Arc::clone(&emitted);
//! per_page.results().foreach_batch(move |batch, _info| {
//!     sink.lock().unwrap().extend(batch.iter().map(|r| (r.key.clone(), r.window.start.as_millis(), r.value)));
//!     Ok(())
//! });
//! let mut graph = builder.build()?;
//!
//! // Read in this order, in two batches: the click at 9.8 s comes after one at 10.1 s.
//! clicks.push(vec![("/a".into(), 1_000), ("/a".into(), 10_100)]);
//! graph.run_batch(Time::from_millis(1_000), BatchId(0))?;
//! clicks.push(vec![("/a".into(), 9_800), ("/b".into(), 12_000)]);
//! graph.run_batch(Time::from_millis(2_000), BatchId(1))?;
//! // The watermark is 12 s - 0.5 s: [0 s, 10 s) is complete, with both of its clicks.
//! assert_eq!(*emitted.lock().unwrap(), [("/a".to_string(), 0, 2)]);
//! # Ok::<(), spate_dstream::DStreamError>(())
//! ```

mod process;
mod progress;
mod windows;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use spate_core::{CoreError, Duration, FrameCodec, Time};

use crate::batch::{Batch, Data, Key};
use crate::error::DStreamError;
use crate::node::{Slot, StepCtx};
use crate::stream::DStream;

pub use process::{EventTimeProcessed, Timed, TimedState};
pub use progress::ProgressMark;
use progress::WriterClocks;
pub use windows::{EventTimeWindowed, WindowResult};

/// How watermarks follow the event times of each input partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermarks {
    out_of_orderness: Duration,
    idle_timeout: Option<Duration>,
    max_future: Duration,
}

/// The most sliding windows one record may fall in (`size / slide`): each
/// record is counted into every one of them, so a shape such as one hour
/// sliding by one millisecond (3.6 million windows a record) is refused
/// when it is declared rather than left to exhaust the machine.
pub const MAX_WINDOWS_PER_RECORD: u64 = 1_000;

/// How far ahead of the processing clock an event time may be, by default.
pub const DEFAULT_MAX_FUTURE: Duration = Duration::from_millis(3_600_000);

impl Watermarks {
    /// Records of a partition arrive at most `bound` behind the latest one
    /// it has delivered: the partition's watermark is its largest event
    /// time minus `bound`.
    pub fn bounded_out_of_orderness(bound: Duration) -> Self {
        Watermarks { out_of_orderness: bound, idle_timeout: None, max_future: DEFAULT_MAX_FUTURE }
    }

    /// A record stamped more than `max_future` ahead of the batch's time
    /// (the processing clock) is not believed: it never moves the
    /// watermark, and goes to the late output instead of into a window.
    /// Without the bound, one record stamped in year 2100 would make every
    /// later record of its partition late for good. Default: one hour
    /// ([`DEFAULT_MAX_FUTURE`]).
    pub fn with_max_future(mut self, max_future: Duration) -> Self {
        self.max_future = max_future;
        self
    }

    /// How far ahead of the processing clock an event time may be.
    pub fn max_future(&self) -> Duration {
        self.max_future
    }

    /// The latest event time believed in the batch at `batch_time`.
    fn horizon(&self, batch_time: Time) -> Time {
        batch_time + self.max_future
    }

    /// A partition without records for `timeout` of batch time is left out
    /// of the stream's watermark until it has records again; so is a writer
    /// that reported itself idle for that long, on a stream whose progress
    /// its writers report ([`DStream::with_progress`]). Without it, a
    /// partition that never delivers holds the watermark back for ever.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(timeout);
        self
    }

    /// The bound on out-of-orderness.
    pub fn out_of_orderness(&self) -> Duration {
        self.out_of_orderness
    }

    /// The idle timeout, if any.
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout
    }
}

/// The shape of event-time windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// `[k*slide, k*slide + size)` for every whole `k`.
    Sliding { size: Duration, slide: Duration },
    /// Per key, records closer than `gap` to each other, `[first, last + gap)`.
    Session { gap: Duration },
}

/// Which event-time windows an aggregation computes, and how long a window
/// takes late records after the watermark passed its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventWindows {
    shape: Shape,
    allowed_lateness: Duration,
}

impl EventWindows {
    /// Back-to-back windows of `size`: `[0, size)`, `[size, 2 size)`, …
    /// (from the epoch).
    pub fn tumbling(size: Duration) -> Self {
        Self::sliding(size, size)
    }

    /// Windows of `size` starting every `slide` (from the epoch); a record
    /// is in `size / slide` of them.
    pub fn sliding(size: Duration, slide: Duration) -> Self {
        EventWindows { shape: Shape::Sliding { size, slide }, allowed_lateness: Duration::ZERO }
    }

    /// Per key, a window of records each less than `gap` after the one
    /// before, from the first record to the last plus `gap`.
    pub fn session(gap: Duration) -> Self {
        EventWindows { shape: Shape::Session { gap }, allowed_lateness: Duration::ZERO }
    }

    /// Keeps each window for `lateness` after the watermark passed its end:
    /// records arriving then update it and it is emitted again.
    pub fn allowed_lateness(mut self, lateness: Duration) -> Self {
        self.allowed_lateness = lateness;
        self
    }

    /// The windows' shape, which the state kept for them depends on (the
    /// allowed lateness only decides how long it is kept).
    fn describe_shape(&self) -> String {
        match self.shape {
            Shape::Sliding { size, slide } if size == slide => format!("tumbling {} ms", size.as_millis()),
            Shape::Sliding { size, slide } => format!("sliding {} ms by {} ms", size.as_millis(), slide.as_millis()),
            Shape::Session { gap } => format!("session gap {} ms", gap.as_millis()),
        }
    }

    /// Why these windows cannot be computed, if they cannot.
    fn problem(&self) -> Option<String> {
        match self.shape {
            Shape::Sliding { size, slide } if size.as_millis() == 0 || slide.as_millis() == 0 => {
                Some(format!("window size ({size}) and slide ({slide}) must be positive"))
            }
            Shape::Sliding { size, slide } if slide > size => Some(format!(
                "slide ({slide}) is longer than the window ({size}): records between windows would be lost"
            )),
            Shape::Sliding { size, slide } if size.as_millis().div_ceil(slide.as_millis()) > MAX_WINDOWS_PER_RECORD => {
                Some(format!(
                    "a window of {size} sliding by {slide} puts every record in {} windows; at most \
                     {MAX_WINDOWS_PER_RECORD} are allowed (make the slide at least {} ms)",
                    size.as_millis().div_ceil(slide.as_millis()),
                    size.as_millis().div_ceil(MAX_WINDOWS_PER_RECORD)
                ))
            }
            Shape::Session { gap } if gap.as_millis() == 0 => Some("session gap must be positive".to_string()),
            _ => None,
        }
    }
}

/// A window of event time, `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Window {
    /// The first instant in the window.
    pub start: Time,
    /// The first instant after the window.
    pub end: Time,
}

/// What an event-time operator produces, and the records it set aside as
/// late, which only [`WithLate::late`] reads (and which are otherwise
/// counted in a warning).
pub struct WithLate<K, V, T> {
    output: DStream<T>,
    late: Arc<Slot<(K, V)>>,
}

impl<K, V, T> std::fmt::Debug for WithLate<K, V, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithLate").field("output", &self.output).finish_non_exhaustive()
    }
}

impl<K: Key, V: Data, T: Data> WithLate<K, V, T> {
    pub(crate) fn new(output: DStream<T>, late: Arc<Slot<(K, V)>>) -> Self {
        WithLate { output, late }
    }

    /// Names the operator (its state is matched by this name on restore).
    pub fn name(mut self, name: &str) -> Self {
        self.output = self.output.name(name);
        self
    }

    /// What the operator emitted.
    pub fn output(&self) -> DStream<T> {
        self.output.clone()
    }

    /// The records set aside as late, in the batch that read them.
    pub fn late(&self) -> DStream<(K, V)> {
        self.output.side_output("late_records", &self.late)
    }
}

/// One input partition's event-time clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct PartitionClock {
    /// The largest event time the partition has delivered.
    max_event_time: Option<Time>,
    /// The batch time of its last record (or of the batch it first appeared in).
    last_active: Time,
}

/// The watermark of an operator's input: per partition, then the minimum;
/// or, for an input whose progress its writers report, per writer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WatermarkTracker {
    partitions: Vec<PartitionClock>,
    watermark: Option<Time>,
    writers: WriterClocks,
}

/// A [`WatermarkTracker`] as version 1 of the event-time state wrote it,
/// before writers reported their progress.
#[derive(Deserialize)]
pub(crate) struct TrackerV1 {
    partitions: Vec<PartitionClock>,
    watermark: Option<Time>,
}

impl From<TrackerV1> for WatermarkTracker {
    fn from(old: TrackerV1) -> Self {
        WatermarkTracker { partitions: old.partitions, watermark: old.watermark, writers: WriterClocks::default() }
    }
}

/// The frame version of event-time operator state; 2 added the writers' clocks.
const EVENT_TIME_STATE_VERSION: u16 = 2;

/// The codec of event-time operator state.
pub(crate) fn event_time_codec() -> FrameCodec {
    FrameCodec::new(EVENT_TIME_STATE_VERSION).with_max_payload(1 << 30).with_max_decoded(4 << 30)
}

/// Decodes an event-time operator's snapshot; one that version 1 wrote is
/// read as `Old` and brought up to date by `upgrade`.
pub(crate) fn decode_snapshot<New: DeserializeOwned, Old: DeserializeOwned>(
    bytes: &[u8],
    upgrade: impl FnOnce(Old) -> New,
) -> Result<New, CoreError> {
    let codec = event_time_codec();
    let frame = codec.open(bytes)?;
    if frame.version < EVENT_TIME_STATE_VERSION {
        return Ok(upgrade(codec.decode_payload(frame.payload)?));
    }
    codec.decode_payload(frame.payload)
}

impl WatermarkTracker {
    /// The stream's watermark: no record before it is expected any more.
    pub(crate) fn current(&self) -> Option<Time> {
        self.watermark
    }

    /// Advances the watermark after a batch: by the writers' marks when the
    /// input's progress comes from them, by each partition's largest event
    /// time (`seen`) otherwise.
    pub(crate) fn advance_batch(
        &mut self,
        batch_time: Time,
        seen: &[Option<Time>],
        marks: Option<&[ProgressMark]>,
        strategy: &Watermarks,
    ) -> Option<Time> {
        match marks {
            Some(marks) => {
                self.watermark = self.writers.advance(marks, batch_time, strategy, self.watermark);
                self.watermark
            }
            None => self.advance(batch_time, seen, strategy),
        }
    }

    /// Takes in the largest event time each input partition delivered in
    /// the batch at `batch_time` (`None`: no records) and returns the
    /// watermark after it.
    pub(crate) fn advance(&mut self, batch_time: Time, seen: &[Option<Time>], strategy: &Watermarks) -> Option<Time> {
        if self.partitions.len() < seen.len() {
            let fresh = PartitionClock { max_event_time: None, last_active: batch_time };
            self.partitions.resize(seen.len(), fresh);
        }
        for (clock, max) in self.partitions.iter_mut().zip(seen) {
            if let Some(max) = *max {
                clock.max_event_time = Some(clock.max_event_time.map_or(max, |old| old.max(max)));
                clock.last_active = batch_time;
            }
        }
        let idle =
            |clock: &PartitionClock| strategy.idle_timeout.is_some_and(|t| batch_time.since(clock.last_active) >= t);
        let mut active = self.partitions.iter().filter(|clock| !idle(clock)).peekable();
        if active.peek().is_some() {
            // A partition that has delivered nothing yet holds the watermark back.
            let lowest: Option<Time> = active.map(|clock| clock.max_event_time).min().flatten();
            if let Some(lowest) = lowest {
                let candidate = lowest - strategy.out_of_orderness;
                self.watermark = Some(self.watermark.map_or(candidate, |old| old.max(candidate)));
            }
        }
        self.watermark
    }
}

/// True when `time` is behind `watermark`.
fn behind(time: Time, watermark: Option<Time>) -> bool {
    watermark.is_some_and(|w| time < w)
}

/// An event-time operator's input for one batch: its records and, when its
/// progress comes from its writers (see [`DStream::with_progress`]), their
/// marks; `None` when there are neither.
fn take_input<K: Clone, V: Clone>(
    ctx: &StepCtx<'_>,
    input: &Slot<(K, V)>,
    marks: Option<&Arc<Slot<ProgressMark>>>,
) -> Result<Option<Input<K, V>>, DStreamError> {
    let marks = match marks {
        Some(slot) => Some(ctx.take_owned(slot)?.map(Batch::into_vec).unwrap_or_default()),
        None => None,
    };
    Ok(match ctx.take_owned(input)? {
        Some(batch) => Some((batch, marks)),
        // Marks still move the watermark when the records have no batch.
        None => marks.map(|marks| (Batch::default(), Some(marks))),
    })
}

/// A batch of an event-time operator's records, and its writers' marks.
type Input<K, V> = (Batch<(K, V)>, Option<Vec<ProgressMark>>);

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Time {
        Time::from_millis(ms)
    }

    #[test]
    fn the_watermark_is_the_slowest_partition_minus_the_bound_and_never_goes_back() {
        let strategy = Watermarks::bounded_out_of_orderness(Duration::from_millis(100));
        let mut tracker = WatermarkTracker::default();
        // Partition 1 has delivered nothing: it holds the watermark back.
        assert_eq!(tracker.advance(t(1000), &[Some(t(5000)), None], &strategy), None);
        assert_eq!(tracker.advance(t(2000), &[Some(t(6000)), Some(t(4000))], &strategy), Some(t(3900)));
        // Partition 0 goes back in time: the watermark does not.
        assert_eq!(tracker.advance(t(3000), &[Some(t(1000)), Some(t(4100))], &strategy), Some(t(4000)));
        assert_eq!(tracker.current(), Some(t(4000)));
    }

    #[test]
    fn an_idle_partition_stops_holding_the_watermark_back_until_it_delivers_again() {
        let strategy =
            Watermarks::bounded_out_of_orderness(Duration::ZERO).with_idle_timeout(Duration::from_millis(2000));
        let mut tracker = WatermarkTracker::default();
        assert_eq!(tracker.advance(t(1000), &[Some(t(100)), Some(t(50))], &strategy), Some(t(50)));
        assert_eq!(tracker.advance(t(2000), &[Some(t(200)), None], &strategy), Some(t(50)));
        // Partition 1 idle for 2 s of batch time: only partition 0 counts.
        assert_eq!(tracker.advance(t(3000), &[Some(t(300)), None], &strategy), Some(t(300)));
        // It delivers again and counts again (the watermark stays where it was).
        assert_eq!(tracker.advance(t(4000), &[Some(t(400)), Some(t(60))], &strategy), Some(t(300)));
        assert_eq!(tracker.advance(t(5000), &[Some(t(500)), Some(t(450))], &strategy), Some(t(450)));
    }

    #[test]
    fn a_tracker_written_before_writers_reported_their_progress_reads_back() {
        #[derive(Serialize)]
        struct Version1 {
            partitions: Vec<PartitionClock>,
            watermark: Option<Time>,
        }
        let clock = PartitionClock { max_event_time: Some(t(5_000)), last_active: t(1_000) };
        let old = Version1 { partitions: vec![clock], watermark: Some(t(4_000)) };
        let bytes = FrameCodec::new(1).encode(&old).unwrap();
        let tracker: WatermarkTracker = decode_snapshot(&bytes, |old: TrackerV1| old.into()).unwrap();
        assert_eq!(tracker.current(), Some(t(4_000)));
        assert_eq!(tracker.partitions.len(), 1);
    }

    #[test]
    fn bad_window_shapes_are_named() {
        assert!(EventWindows::sliding(Duration::from_secs(1), Duration::from_secs(2)).problem().is_some());
        assert!(EventWindows::tumbling(Duration::ZERO).problem().is_some());
        assert!(EventWindows::session(Duration::ZERO).problem().is_some());
        assert!(EventWindows::sliding(Duration::from_secs(10), Duration::from_secs(2)).problem().is_none());
        let fine = EventWindows::sliding(Duration::from_secs(1000), Duration::from_secs(1));
        assert!(fine.problem().is_none(), "1000 windows a record is the limit");
        let dense = EventWindows::sliding(Duration::from_millis(3_600_000), Duration::from_millis(1));
        let problem = dense.problem().unwrap();
        assert!(problem.contains("3600000 windows") && problem.contains("at most 1000"), "{problem}");
        let tumbling = EventWindows::tumbling(Duration::from_secs(10)).allowed_lateness(Duration::from_secs(1));
        assert_eq!(tumbling.describe_shape(), "tumbling 10000 ms");
    }
}
