//! The rate controller: turns completed batches into the rate limit that
//! receivers and direct sources run under (Spark's `RateController`).

use spate_core::Duration;
use tracing::debug;

use crate::error::RuntimeError;
use crate::rate_estimator::PidRateEstimator;
use crate::settings::BackpressureSettings;

/// What one completed batch tells the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchTiming {
    /// When the batch finished, ms since the epoch.
    pub(crate) completed_at_ms: i64,
    /// Records it processed.
    pub(crate) records: u64,
    /// How long it ran, ms.
    pub(crate) processing_ms: u64,
    /// How long it waited, ms.
    pub(crate) scheduling_delay_ms: u64,
}

/// Holds the rate in force and updates it after each batch.
///
/// Spark's estimator says nothing after the first batch it sees (that
/// batch only seeds it), so without an initial rate the source runs
/// unlimited until a second batch completes. When the first batch took
/// longer than the interval, the source is already faster than the
/// engine, and by the time the second completes it has filled a batch
/// or two more at its own speed: such a batch sets the rate to what it
/// processed (the estimator's seed) at once.
#[derive(Debug)]
pub(crate) struct RateController {
    estimator: Option<PidRateEstimator>,
    batch_interval_ms: u64,
    min_rate: f64,
    max_rate: Option<f64>,
    current: Option<f64>,
}

impl RateController {
    /// A controller for `batch_interval`; with backpressure off it only
    /// applies the configured maximum.
    pub(crate) fn new(batch_interval: Duration, settings: &BackpressureSettings) -> Result<Self, RuntimeError> {
        let estimator = if settings.enabled {
            Some(PidRateEstimator::new(batch_interval.as_millis(), settings.pid)?)
        } else {
            None
        };
        let current = match (settings.enabled.then_some(settings.initial_rate).flatten(), settings.max_rate) {
            (Some(initial), Some(max)) => Some(initial.min(max)),
            (initial, max) => initial.or(max),
        };
        Ok(RateController {
            estimator,
            batch_interval_ms: batch_interval.as_millis(),
            min_rate: settings.pid.min_rate,
            max_rate: settings.max_rate,
            current,
        })
    }

    /// The rate in force, records per second (`None`: unlimited).
    pub(crate) fn current(&self) -> Option<f64> {
        self.current
    }

    /// Feeds a completed batch; returns the new rate when it changed.
    pub(crate) fn on_batch_completed(&mut self, timing: BatchTiming) -> Option<f64> {
        let estimator = self.estimator.as_mut()?;
        let estimate =
            estimator.compute(timing.completed_at_ms, timing.records, timing.processing_ms, timing.scheduling_delay_ms);
        let estimate = match estimate {
            Some(estimate) => estimate,
            None => self.fell_behind_unlimited(&timing)?,
        };
        let rate = self.max_rate.map_or(estimate, |max| estimate.min(max));
        debug!(rate, "backpressure rate updated");
        self.current = Some(rate);
        Some(rate)
    }

    /// The rate `timing`'s batch processed at, when it ran longer than the
    /// interval while the source had no rate yet.
    fn fell_behind_unlimited(&self, timing: &BatchTiming) -> Option<f64> {
        let behind = timing.processing_ms > self.batch_interval_ms && timing.records > 0;
        (self.current.is_none() && behind)
            .then(|| (timing.records as f64 * 1000.0 / timing.processing_ms as f64).max(self.min_rate))
    }

    /// Records one batch may take at the current rate over `interval`
    /// (`None`: unlimited). Never zero, so a stream always makes progress.
    pub(crate) fn records_per_batch(&self, interval: Duration) -> Option<u64> {
        self.current.map(|rate| ((rate * interval.as_secs_f64()).floor() as u64).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(at: i64, records: u64, processing_ms: u64) -> BatchTiming {
        BatchTiming { completed_at_ms: at, records, processing_ms, scheduling_delay_ms: 0 }
    }

    #[test]
    fn initial_rate_then_estimates_capped_by_max() {
        let settings = BackpressureSettings { initial_rate: Some(500.0), max_rate: Some(8000.0), ..Default::default() };
        let mut rc = RateController::new(Duration::from_secs(1), &settings).unwrap();
        assert_eq!(rc.current(), Some(500.0));
        assert_eq!(rc.records_per_batch(Duration::from_secs(2)), Some(1000));
        assert_eq!(rc.on_batch_completed(timing(1000, 500, 100)), None); // seeds at 5000/s
        // Processing 10 000/s with the seed at 5 000: error -5 000 => 10 000, capped at 8 000.
        assert_eq!(rc.on_batch_completed(timing(2000, 1000, 100)), Some(8000.0));
        assert_eq!(rc.current(), Some(8000.0));
    }

    #[test]
    fn a_first_batch_that_fell_behind_sets_the_rate_it_processed() {
        let mut rc = RateController::new(Duration::from_secs(1), &BackpressureSettings::default()).unwrap();
        assert_eq!(rc.current(), None);
        // 3 000 000 records in 1.5 s: the source outran the engine.
        assert_eq!(rc.on_batch_completed(timing(1500, 3_000_000, 1500)), Some(2_000_000.0));
        assert_eq!(rc.records_per_batch(Duration::from_secs(1)), Some(2_000_000));
        // The estimator was seeded with that rate: the same rate processed again keeps it.
        assert_eq!(rc.on_batch_completed(timing(3000, 2_000_000, 1000)), Some(2_000_000.0));
    }

    #[test]
    fn a_first_batch_within_its_interval_leaves_the_source_unlimited() {
        let mut rc = RateController::new(Duration::from_secs(1), &BackpressureSettings::default()).unwrap();
        assert_eq!(rc.on_batch_completed(timing(1000, 3_000_000, 1000)), None);
        assert_eq!(rc.current(), None);
        assert_eq!(rc.on_batch_completed(timing(2000, 3_000_000, 1000)), Some(3_000_000.0));
    }

    #[test]
    fn a_first_batch_that_fell_behind_stays_within_the_maximum_and_the_floor() {
        let capped = BackpressureSettings { max_rate: Some(1000.0), initial_rate: None, ..Default::default() };
        let mut rc = RateController::new(Duration::from_secs(1), &capped).unwrap();
        assert_eq!(rc.current(), Some(1000.0), "the maximum applies from the start");
        assert_eq!(rc.on_batch_completed(timing(2000, 2000, 2000)), None, "a rate was already in force");
        let mut rc = RateController::new(Duration::from_secs(1), &BackpressureSettings::default()).unwrap();
        assert_eq!(rc.on_batch_completed(timing(3000, 20, 3000)), Some(100.0), "the estimator's floor");
    }

    #[test]
    fn disabled_backpressure_keeps_the_maximum() {
        let settings =
            BackpressureSettings { enabled: false, initial_rate: Some(10.0), max_rate: None, ..Default::default() };
        let mut rc = RateController::new(Duration::from_secs(1), &settings).unwrap();
        assert_eq!(rc.current(), None);
        rc.on_batch_completed(timing(1000, 500, 100));
        assert_eq!(rc.on_batch_completed(timing(2000, 500, 100)), None);
        assert_eq!(rc.records_per_batch(Duration::from_secs(1)), None);
    }
}
