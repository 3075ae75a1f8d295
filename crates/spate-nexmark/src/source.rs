//! The generator as a replayable spate source.
//!
//! A batch at time `T` reads every event due by `T` that earlier batches
//! did not read: the events whose due time
//! ([`NexmarkGenerator::emit_time_ms`]) is at most `T`, so the source
//! produces `events_per_second` events per second of batch time, the way
//! the spec's source emits an event when the wall clock reaches its time.
//! With a base time in the past the first batches catch up, at most
//! `max_per_batch` events each (and at most what backpressure allows).
//!
//! What a batch plans is a range of positions, logged as
//! `{"from":F,"until":U,"seed":S,"base_time_ms":B}`; computing a batch
//! generates exactly those positions with that seed and base time, so a
//! batch re-run after a crash reads the same events, and a restarted
//! source continues at `U` on the logged timeline (its resume hook).

use std::ops::Range;
use std::sync::{Arc, Mutex, RwLock};

use serde::{Deserialize, Serialize};
use spate_core::Time;
use spate_core::sync::{lock, read, write};
use spate_dstream::{BatchLimits, BoxError, InputSource};

use crate::error::NexmarkError;
use crate::generator::NexmarkGenerator;
use crate::model::Event;

/// Below this many events a batch is generated on the calling thread.
const PARALLEL_THRESHOLD: u64 = 4096;

/// What a batch plans, as logged to `offsets/N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Planned {
    from: u64,
    until: u64,
    seed: u64,
    base_time_ms: i64,
}

impl Planned {
    fn parse(offsets: &str) -> Result<Planned, NexmarkError> {
        let planned: Planned = serde_json::from_str(offsets)
            .map_err(|source| NexmarkError::BadOffsets { offsets: offsets.to_string(), source })?;
        if planned.from > planned.until {
            return Err(NexmarkError::BackwardRange {
                offsets: offsets.to_string(),
                from: planned.from,
                until: planned.until,
            });
        }
        Ok(planned)
    }
}

/// A replayable source of Nexmark events (see the module docs).
///
/// Register it with `PipelineBuilder::replayable_input` and its
/// [`resume_hook`](NexmarkSource::resume_hook), so that a restart continues
/// where the last logged batch ended.
#[derive(Debug)]
pub struct NexmarkSource {
    generator: RwLock<NexmarkGenerator>,
    partitions: usize,
    max_per_batch: u64,
    /// The first position no batch has planned yet.
    position: Mutex<u64>,
}

impl NexmarkSource {
    /// A source of `generator`'s events, in one partition, at most ten
    /// seconds of events per batch.
    pub fn new(generator: NexmarkGenerator) -> Self {
        let ten_seconds = (generator.config().events_per_second * 10.0).ceil().max(1.0) as u64;
        NexmarkSource {
            generator: RwLock::new(generator),
            partitions: 1,
            max_per_batch: ten_seconds,
            position: Mutex::new(0),
        }
    }

    /// Splits each batch into `partitions` contiguous ranges of positions,
    /// generated in parallel (at least 1).
    pub fn with_partitions(mut self, partitions: usize) -> Self {
        self.partitions = partitions.max(1);
        self
    }

    /// Reads at most `max` events a batch (at least 1).
    pub fn with_max_per_batch(mut self, max: u64) -> Self {
        self.max_per_batch = max.max(1);
        self
    }

    /// The generator the next batch plans from.
    pub fn generator(&self) -> NexmarkGenerator {
        read(&self.generator).clone()
    }

    /// The first position no batch has planned yet.
    pub fn position(&self) -> u64 {
        *lock(&self.position)
    }

    /// True when every event has been planned (never, without `max_events`).
    pub fn is_exhausted(&self) -> bool {
        self.generator().max_events().is_some_and(|max| self.position() >= max)
    }

    /// Continues after the batch whose logged offsets are `offsets`: the
    /// next batch starts at its end, on its seed and base time.
    pub fn resume_from(&self, offsets: &str) -> Result<(), NexmarkError> {
        let planned = Planned::parse(offsets)?;
        let generator = self.generator_for(&planned)?;
        *write(&self.generator) = generator;
        *lock(&self.position) = planned.until;
        Ok(())
    }

    /// [`resume_from`](NexmarkSource::resume_from) as the `on_resume` hook
    /// of `PipelineBuilder::replayable_input`.
    #[allow(clippy::type_complexity)]
    pub fn resume_hook(self: &Arc<Self>) -> Box<dyn Fn(&str) -> Result<(), String> + Send> {
        let source = Arc::clone(self);
        Box::new(move |offsets: &str| source.resume_from(offsets).map_err(|e| e.to_string()))
    }

    /// The generator of a planned batch: the current one, or one on the
    /// batch's logged seed and base time when they differ.
    fn generator_for(&self, planned: &Planned) -> Result<NexmarkGenerator, NexmarkError> {
        let current = self.generator();
        let config = current.config();
        if config.seed != planned.seed {
            let mut config = config.clone();
            config.seed = planned.seed;
            config.base_time_ms = planned.base_time_ms;
            return NexmarkGenerator::new(config);
        }
        if config.base_time_ms != planned.base_time_ms {
            return Ok(current.with_base_time(planned.base_time_ms));
        }
        Ok(current)
    }

    /// The end of the range a batch at `time_ms` starting at `from` reads:
    /// the first position not due by `time_ms`, within the limits.
    fn due_until(generator: &NexmarkGenerator, from: u64, time_ms: i64, limit: u64) -> u64 {
        // Due times never decrease with the position: search for the first
        // position in from..limit due after time_ms.
        let (mut low, mut high) = (from, limit);
        while low < high {
            let mid = low + (high - low) / 2;
            if generator.emit_time_ms(mid) <= time_ms {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// `range` cut into the source's partitions, in order.
    fn split(&self, range: Range<u64>) -> Vec<Range<u64>> {
        let parts = self.partitions as u64;
        let len = range.end - range.start;
        let chunk = len.div_ceil(parts).max(1);
        (0..parts)
            .map(|i| {
                let start = (range.start + i * chunk).min(range.end);
                start..(start + chunk).min(range.end)
            })
            .collect()
    }
}

impl InputSource<Event> for NexmarkSource {
    fn is_replayable(&self) -> bool {
        true
    }

    fn plan(&self, time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let generator = self.generator();
        let mut position = lock(&self.position);
        let from = *position;
        let mut limit = from.saturating_add(self.max_per_batch.min(limits.max_records.unwrap_or(u64::MAX)));
        if let Some(max) = generator.max_events() {
            limit = limit.min(max).max(from);
        }
        let until = Self::due_until(&generator, from, time.as_millis(), limit);
        let config = generator.config();
        let planned = Planned { from, until, seed: config.seed, base_time_ms: config.base_time_ms };
        *position = until;
        Ok(Some(serde_json::to_string(&planned)?))
    }

    fn compute(&self, time: Time, planned: Option<&str>) -> Result<Vec<Vec<Event>>, BoxError> {
        let planned = Planned::parse(planned.ok_or(NexmarkError::MissingPlan { time_ms: time.as_millis() })?)?;
        let generator = self.generator_for(&planned)?;
        {
            let mut position = lock(&self.position);
            *position = (*position).max(planned.until);
        }
        let mut ranges = self.split(planned.from..planned.until).into_iter();
        if self.partitions == 1 || planned.until - planned.from < PARALLEL_THRESHOLD {
            return Ok(ranges.map(|r| generator.events(r)).collect());
        }
        let Some(first) = ranges.next() else { return Ok(Vec::new()) };
        Ok(std::thread::scope(|scope| {
            let generator = &generator;
            let others: Vec<_> = ranges.map(|r| scope.spawn(move || generator.events(r))).collect();
            // The calling thread would only wait: it makes the first
            // partition, which saves a thread's start and exit (and the
            // flush of its allocator cache) a batch.
            let mut partitions = Vec::with_capacity(self.partitions);
            partitions.push(generator.events(first));
            for handle in others {
                partitions.push(handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            }
            partitions
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::GeneratorSettings;

    const BASE: i64 = 1_000_000;

    fn source(rate: f64, max_events: u64) -> NexmarkSource {
        let config = GeneratorSettings::new(9, BASE).with_rate(rate).with_max_events(max_events);
        NexmarkSource::new(NexmarkGenerator::new(config).unwrap())
    }

    fn range(planned: &str) -> (u64, u64) {
        let p = Planned::parse(planned).unwrap();
        (p.from, p.until)
    }

    #[test]
    fn a_batch_reads_the_events_due_by_its_time() {
        // 1000 events a second: event n is due at BASE + n ms.
        let s = source(1000.0, 10_000);
        let first = s.plan(Time::from_millis(BASE + 1000), BatchLimits::UNLIMITED).unwrap().unwrap();
        assert_eq!(range(&first), (0, 1001));
        let second = s.plan(Time::from_millis(BASE + 2000), BatchLimits::UNLIMITED).unwrap().unwrap();
        assert_eq!(range(&second), (1001, 2001));
        let events = s.compute(Time::from_millis(BASE + 2000), Some(&second)).unwrap();
        assert!(events[0].iter().all(|e| e.timestamp_ms() <= BASE + 2000 && e.timestamp_ms() > BASE + 1000));
        // Before the base time nothing is due.
        let early = source(1000.0, 10_000);
        assert_eq!(range(&early.plan(Time::from_millis(BASE - 1), BatchLimits::UNLIMITED).unwrap().unwrap()), (0, 0));
    }

    #[test]
    fn backpressure_the_batch_cap_and_the_total_bound_a_batch() {
        let s = source(1000.0, 2_500).with_max_per_batch(700);
        assert_eq!(
            range(&s.plan(Time::from_millis(BASE + 5000), BatchLimits::records(300)).unwrap().unwrap()),
            (0, 300)
        );
        assert_eq!(
            range(&s.plan(Time::from_millis(BASE + 5000), BatchLimits::UNLIMITED).unwrap().unwrap()),
            (300, 1000)
        );
        for _ in 0..3 {
            s.plan(Time::from_millis(BASE + 9000), BatchLimits::UNLIMITED).unwrap();
        }
        assert_eq!(s.position(), 2_500);
        assert!(s.is_exhausted());
        assert_eq!(
            range(&s.plan(Time::from_millis(BASE + 9000), BatchLimits::UNLIMITED).unwrap().unwrap()),
            (2_500, 2_500)
        );
    }

    #[test]
    fn a_replanned_batch_reads_the_same_events_in_another_process() {
        let s = source(1000.0, 10_000).with_partitions(3);
        s.plan(Time::from_millis(BASE + 1000), BatchLimits::UNLIMITED).unwrap();
        let planned = s.plan(Time::from_millis(BASE + 9000), BatchLimits::UNLIMITED).unwrap().unwrap();
        let before = s.compute(Time::from_millis(BASE + 9000), Some(&planned)).unwrap();
        assert_eq!(before.len(), 3);
        // A new process, configured with another base time (as `now` would
        // give), re-runs the logged batch and then continues after it.
        let config = GeneratorSettings::new(9, BASE + 123_456).with_rate(1000.0).with_max_events(10_000);
        let restarted = NexmarkSource::new(NexmarkGenerator::new(config).unwrap()).with_partitions(3);
        // The logged plan alone decides the events, before any resume too.
        let after = restarted.compute(Time::from_millis(BASE + 9000), Some(&planned)).unwrap();
        assert_eq!(before, after);
        restarted.resume_from(&planned).unwrap();
        let again = restarted.compute(Time::from_millis(BASE + 9000), Some(&planned)).unwrap();
        assert_eq!(before, again);
        let next = restarted.plan(Time::from_millis(BASE + 9500), BatchLimits::UNLIMITED).unwrap().unwrap();
        assert_eq!(range(&next), (9001, 9501));
        assert_eq!(Planned::parse(&next).unwrap().base_time_ms, BASE);
    }

    #[test]
    fn partitions_cover_the_range_in_order() {
        let s = source(1000.0, 10_000).with_partitions(4);
        let planned = s.plan(Time::from_millis(BASE + 5000), BatchLimits::UNLIMITED).unwrap().unwrap();
        let parts = s.compute(Time::from_millis(BASE + 5000), Some(&planned)).unwrap();
        let generator = s.generator();
        let flat: Vec<Event> = parts.into_iter().flatten().collect();
        assert_eq!(flat, generator.events(0..5001));
    }

    #[test]
    fn bad_offsets_are_errors_naming_them() {
        let s = source(1000.0, 10);
        let err = s.resume_from("{\"from\":1}").unwrap_err();
        assert!(err.to_string().contains("{\\\"from\\\":1}"), "{err}");
        let backwards = r#"{"from":5,"until":2,"seed":9,"base_time_ms":0}"#;
        assert!(matches!(s.resume_from(backwards), Err(NexmarkError::BackwardRange { from: 5, until: 2, .. })));
        assert!(s.compute(Time::from_millis(0), None).is_err());
    }
}
