//! The settings of a job kept in a file: JSON, every field optional, a
//! field it does not know refused (a misspelt setting must not be ignored
//! silently). Laid over [`StreamingSettings`]: a field present replaces
//! the setting, an absent one leaves it.
//!
//! ```json
//! {
//!   "batch_interval_ms": 1000,
//!   "checkpoint": "s3://bucket/jobs/words",
//!   "wal_dir": "/var/lib/spate/words",
//!   "max_memory_bytes": 268435456,
//!   "max_records_per_batch": 500000,
//!   "backpressure": { "enabled": true, "max_rate": 200000 }
//! }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use spate_core::Duration;

use crate::error::RuntimeError;
use crate::settings::StreamingSettings;

/// The fields of a settings file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    batch_interval_ms: Option<u64>,
    checkpoint_interval_ms: Option<u64>,
    concurrent_jobs: Option<usize>,
    retained_batches: Option<u64>,
    full_snapshot_every: Option<u64>,
    max_memory_bytes: Option<u64>,
    max_records_per_batch: Option<u64>,
    max_bytes_per_batch: Option<u64>,
    spill_dir: Option<PathBuf>,
    max_spill_bytes: Option<u64>,
    checkpoint: Option<PathBuf>,
    wal_dir: Option<PathBuf>,
    metrics_addr: Option<SocketAddr>,
    ui_addr: Option<SocketAddr>,
    backpressure: Option<BackpressureFile>,
}

/// The backpressure part of a settings file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BackpressureFile {
    enabled: Option<bool>,
    initial_rate: Option<f64>,
    max_rate: Option<f64>,
}

impl StreamingSettings {
    /// Settings from the JSON text `json`; it must name the batch interval
    /// (`batch_interval_ms`), every other setting has its default.
    pub fn from_json(json: &str) -> Result<Self, RuntimeError> {
        let file = parse(json)?;
        let Some(interval) = file.batch_interval_ms else {
            return Err(invalid("batch_interval_ms", "the settings name no batch interval".into()));
        };
        StreamingSettings::new(Duration::from_millis(interval)).laid_over_by(file)
    }

    /// These settings with the fields of the JSON text `json` laid over them.
    pub fn overlay_json(self, json: &str) -> Result<Self, RuntimeError> {
        self.laid_over_by(parse(json)?)
    }

    /// [`StreamingSettings::overlay_json`] of the file at `path`.
    pub fn overlay_file(self, path: &Path) -> Result<Self, RuntimeError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| invalid("settings file", format!("cannot read {}: {e}", path.display())))?;
        self.overlay_json(&text).map_err(|e| match e {
            RuntimeError::InvalidSetting { setting, reason } => {
                RuntimeError::InvalidSetting { setting, reason: format!("{reason} (in {})", path.display()) }
            }
            other => other,
        })
    }

    fn laid_over_by(mut self, file: SettingsFile) -> Result<Self, RuntimeError> {
        let millis = |ms: u64| Duration::from_millis(ms);
        set(&mut self.batch_interval, file.batch_interval_ms.map(millis));
        set(&mut self.checkpoint_interval, file.checkpoint_interval_ms.map(|ms| Some(millis(ms))));
        set(&mut self.concurrent_jobs, file.concurrent_jobs);
        set(&mut self.retained_batches, file.retained_batches);
        set(&mut self.full_snapshot_every, file.full_snapshot_every);
        set(&mut self.max_memory_bytes, file.max_memory_bytes);
        set(&mut self.max_records_per_batch, file.max_records_per_batch);
        set(&mut self.max_bytes_per_batch, file.max_bytes_per_batch.map(Some));
        set(&mut self.spill_dir, file.spill_dir.map(Some));
        set(&mut self.max_spill_bytes, file.max_spill_bytes.map(Some));
        set(&mut self.checkpoint, file.checkpoint.map(Some));
        set(&mut self.wal_dir, file.wal_dir.map(Some));
        set(&mut self.metrics_addr, file.metrics_addr.map(Some));
        set(&mut self.ui_addr, file.ui_addr.map(Some));
        if let Some(backpressure) = file.backpressure {
            set(&mut self.backpressure.enabled, backpressure.enabled);
            set(&mut self.backpressure.initial_rate, backpressure.initial_rate.map(Some));
            set(&mut self.backpressure.max_rate, backpressure.max_rate.map(Some));
        }
        self.validate()?;
        Ok(self)
    }
}

fn set<T>(setting: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *setting = value;
    }
}

fn parse(json: &str) -> Result<SettingsFile, RuntimeError> {
    serde_json::from_str(json).map_err(|e| invalid("settings file", e.to_string()))
}

fn invalid(setting: &str, reason: String) -> RuntimeError {
    RuntimeError::InvalidSetting { setting: setting.to_string(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_sets_what_it_names_and_leaves_the_rest() {
        let settings = StreamingSettings::from_json(
            r#"{"batch_interval_ms": 500, "max_memory_bytes": 1048576, "checkpoint": "/tmp/ck",
                "backpressure": {"enabled": false}}"#,
        )
        .unwrap();
        assert_eq!(settings.batch_interval, Duration::from_millis(500));
        assert_eq!(settings.max_memory_bytes, 1 << 20);
        assert_eq!(settings.checkpoint.as_deref(), Some(Path::new("/tmp/ck")));
        assert!(!settings.backpressure.enabled);
        assert_eq!(settings.concurrent_jobs, 1);
        // The byte cap follows the budget it was given: a quarter of it.
        assert_eq!(settings.batch_bytes(), 1 << 18);
    }

    #[test]
    fn an_unknown_or_misspelt_field_is_refused_naming_it() {
        let err = StreamingSettings::from_json(r#"{"batch_interval_ms": 500, "max_memroy_bytes": 1}"#).unwrap_err();
        assert!(err.to_string().contains("max_memroy_bytes"), "{err}");
        let err =
            StreamingSettings::from_json(r#"{"batch_interval_ms": 500, "backpressure": {"on": true}}"#).unwrap_err();
        assert!(err.to_string().contains("on"), "{err}");
        let err = StreamingSettings::from_json(r#"{"max_memory_bytes": 1}"#).unwrap_err();
        assert!(err.to_string().contains("batch interval"), "{err}");
    }

    #[test]
    fn a_file_over_settings_is_validated_as_a_whole() {
        let base = StreamingSettings::new(Duration::from_secs(1));
        let err = base.clone().overlay_json(r#"{"max_bytes_per_batch": 4096, "max_memory_bytes": 1024}"#).unwrap_err();
        assert!(err.to_string().contains("max_bytes_per_batch"), "{err}");
        let err = base.clone().overlay_json(r#"{"full_snapshot_every": 0}"#).unwrap_err();
        assert!(err.to_string().contains("full_snapshot_every"), "{err}");
        assert_eq!(base.clone().overlay_json(r#"{"full_snapshot_every": 1}"#).unwrap().full_snapshot_every, 1);
        let laid = base.overlay_json(r#"{"max_records_per_batch": 10}"#).unwrap();
        assert_eq!(laid.batch_interval, Duration::from_secs(1));
        assert_eq!(laid.batch_limits(Some(20)).max_records, Some(10));
        assert_eq!(laid.batch_limits(Some(5)).max_records, Some(5));
    }
}
