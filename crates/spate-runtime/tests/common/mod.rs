//! What the runtime's integration tests share: a replayable source of the
//! integers.

use std::sync::{Arc, Mutex};

use serde_json::json;
use spate_core::Time;
use spate_dstream::{BatchLimits, BoxError, InputSource};

/// A replayable source of the integers 0, 1, 2, …: a batch reads the range
/// `from..until` it planned; `available` says how far the "log" goes.
#[derive(Debug)]
pub(crate) struct Numbers {
    pub(crate) position: Mutex<u64>,
    pub(crate) available: Mutex<u64>,
    per_batch: u64,
}

impl Numbers {
    pub(crate) fn new(per_batch: u64) -> Arc<Self> {
        Arc::new(Numbers { position: Mutex::new(0), available: Mutex::new(u64::MAX), per_batch })
    }
}

/// The range a plan names.
pub(crate) fn range_of(planned: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(planned).unwrap();
    (v["from"].as_u64().unwrap(), v["until"].as_u64().unwrap())
}

impl InputSource<u64> for Numbers {
    fn is_replayable(&self) -> bool {
        true
    }

    fn plan(&self, _time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let mut position = self.position.lock().unwrap();
        let n = limits.max_records.map_or(self.per_batch, |m| m.min(self.per_batch));
        let until = (*position + n).min(*self.available.lock().unwrap());
        let planned = json!({"from": *position, "until": until}).to_string();
        *position = until;
        Ok(Some(planned))
    }

    fn compute(&self, _time: Time, planned: Option<&str>) -> Result<Vec<Vec<u64>>, BoxError> {
        let (from, until) = range_of(planned.ok_or("no plan")?);
        let mut position = self.position.lock().unwrap();
        *position = (*position).max(until);
        Ok(vec![(from..until).collect()])
    }
}
