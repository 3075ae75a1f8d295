//! The PID rate estimator behind backpressure (Spark's `PIDRateEstimator`).
//!
//! After each batch it compares the rate the source was allowed with the rate
//! the engine actually processed, and moves the allowed rate toward what the
//! engine sustains: the proportional term corrects the current error, the
//! integral term drains the backlog that the scheduling delay measures, and
//! the derivative term damps sudden changes. Pure arithmetic, no clock: the
//! caller passes the batch's completion time.

use serde::{Deserialize, Serialize};

use crate::error::RuntimeError;

/// The gains and floor of a [`PidRateEstimator`]; the defaults are Spark's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PidSettings {
    /// Weight of the current error (records/s the source runs ahead of processing).
    pub proportional: f64,
    /// Weight of the accumulated error that the scheduling delay stands for.
    pub integral: f64,
    /// Weight of the error's rate of change.
    pub derivative: f64,
    /// The rate never drops below this many records per second.
    pub min_rate: f64,
}

impl Default for PidSettings {
    fn default() -> Self {
        PidSettings { proportional: 1.0, integral: 0.2, derivative: 0.0, min_rate: 100.0 }
    }
}

/// Estimates the ingestion rate (records per second) the engine sustains.
#[derive(Clone, Debug)]
pub struct PidRateEstimator {
    batch_interval_ms: u64,
    settings: PidSettings,
    first_run: bool,
    latest_time_ms: i64,
    latest_rate: f64,
    latest_error: f64,
}

impl PidRateEstimator {
    /// An estimator for batches of `batch_interval_ms`; refuses a zero
    /// interval, negative gains and a floor that is not positive.
    pub fn new(batch_interval_ms: u64, settings: PidSettings) -> Result<Self, RuntimeError> {
        let invalid = |what: &str, value: f64| RuntimeError::InvalidSetting {
            setting: what.to_string(),
            reason: format!("{value} is out of range"),
        };
        if batch_interval_ms == 0 {
            return Err(invalid("batch interval", 0.0));
        }
        for (name, gain) in [
            ("proportional", settings.proportional),
            ("integral", settings.integral),
            ("derivative", settings.derivative),
        ] {
            if !(gain >= 0.0 && gain.is_finite()) {
                return Err(invalid(&format!("backpressure {name} gain"), gain));
            }
        }
        if !(settings.min_rate > 0.0 && settings.min_rate.is_finite()) {
            return Err(invalid("backpressure min rate", settings.min_rate));
        }
        Ok(PidRateEstimator {
            batch_interval_ms,
            settings,
            first_run: true,
            latest_time_ms: -1,
            latest_rate: -1.0,
            latest_error: -1.0,
        })
    }

    /// Feeds one completed batch and returns the new rate, or `None` when
    /// there is nothing to say yet: the first batch only seeds the estimate,
    /// and empty batches, instant batches and out-of-order reports are skipped.
    ///
    /// `time_ms` is when the batch finished, `elements` the records it
    /// processed, `processing_delay_ms` how long its jobs took and
    /// `scheduling_delay_ms` how long it waited before starting.
    pub fn compute(
        &mut self,
        time_ms: i64,
        elements: u64,
        processing_delay_ms: u64,
        scheduling_delay_ms: u64,
    ) -> Option<f64> {
        if time_ms <= self.latest_time_ms || elements == 0 || processing_delay_ms == 0 {
            return None;
        }
        let seconds_since_update = (time_ms - self.latest_time_ms) as f64 / 1000.0;
        let processing_rate = elements as f64 / processing_delay_ms as f64 * 1000.0;
        // Positive when the source was allowed more than the engine processed.
        let error = self.latest_rate - processing_rate;
        // The backlog the scheduling delay stands for, spread over one batch interval.
        let historical_error = scheduling_delay_ms as f64 * processing_rate / self.batch_interval_ms as f64;
        let d_error = (error - self.latest_error) / seconds_since_update;
        let s = &self.settings;
        let new_rate =
            (self.latest_rate - s.proportional * error - s.integral * historical_error - s.derivative * d_error)
                .max(s.min_rate);
        self.latest_time_ms = time_ms;
        if self.first_run {
            self.latest_rate = processing_rate;
            self.latest_error = 0.0;
            self.first_run = false;
            return None;
        }
        self.latest_rate = new_rate;
        self.latest_error = error;
        Some(new_rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimator() -> PidRateEstimator {
        PidRateEstimator::new(1000, PidSettings::default()).unwrap()
    }

    #[test]
    fn first_batch_only_seeds_the_rate() {
        let mut pid = estimator();
        assert_eq!(pid.compute(1000, 5000, 500, 0), None);
        // Seeded at 10 000 records/s; processing exactly that rate with no
        // delay keeps it.
        assert_eq!(pid.compute(2000, 10_000, 1000, 0), Some(10_000.0));
    }

    #[test]
    fn proportional_and_integral_terms_match_hand_computation() {
        let mut pid = estimator();
        pid.compute(1000, 20_000, 1000, 0); // latest rate 20 000
        // Processed 15 000 in 1 s => processing rate 15 000, error 5 000.
        // Scheduling delay 400 ms => historical error 400 * 15 000 / 1000 = 6 000.
        // new = 20 000 - 1.0 * 5 000 - 0.2 * 6 000 = 13 800.
        assert_eq!(pid.compute(2000, 15_000, 1000, 400), Some(13_800.0));
        // Next: processed 13 800 in 600 ms => 23 000/s, error 13 800 - 23 000 = -9 200.
        // new = 13 800 + 9 200 - 0 = 23 000.
        assert_eq!(pid.compute(3000, 13_800, 600, 0), Some(23_000.0));
    }

    #[test]
    fn derivative_term_uses_error_change_per_second() {
        let settings = PidSettings { proportional: 0.0, integral: 0.0, derivative: 0.5, min_rate: 1.0 };
        let mut pid = PidRateEstimator::new(1000, settings).unwrap();
        pid.compute(0, 1000, 1000, 0); // latest rate 1000, error 0
        // Processing rate 500 => error 500; d_error = (500 - 0) / 2 s = 250.
        // new = 1000 - 0.5 * 250 = 875.
        assert_eq!(pid.compute(2000, 500, 1000, 0), Some(875.0));
    }

    #[test]
    fn rate_never_drops_below_the_floor() {
        let mut pid = estimator();
        pid.compute(1000, 1000, 1000, 0);
        // Very slow processing: 10 records in 1 s with a large delay.
        assert_eq!(pid.compute(2000, 10, 1000, 10_000), Some(100.0));
    }

    #[test]
    fn skips_empty_instant_and_stale_batches() {
        let mut pid = estimator();
        pid.compute(1000, 1000, 1000, 0);
        assert_eq!(pid.compute(2000, 0, 1000, 0), None);
        assert_eq!(pid.compute(2000, 1000, 0, 0), None);
        assert_eq!(pid.compute(1000, 1000, 1000, 0), None);
        assert!(pid.compute(2000, 1000, 1000, 0).is_some());
    }

    #[test]
    fn refuses_invalid_settings() {
        assert!(PidRateEstimator::new(0, PidSettings::default()).is_err());
        let negative = PidSettings { integral: -0.1, ..PidSettings::default() };
        assert!(PidRateEstimator::new(1000, negative).is_err());
        let no_floor = PidSettings { min_rate: 0.0, ..PidSettings::default() };
        assert!(PidRateEstimator::new(1000, no_floor).is_err());
    }
}
