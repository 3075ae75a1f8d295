//! The settings of a job run by the command: spate-runtime's settings
//! tree, with the `--settings` file laid over its defaults and the flags
//! given on the command line laid over both. Every check is the
//! runtime's own ([`StreamingSettings::validate`]); a refusal is a usage
//! error (exit code 2).

use spate_core::Duration;
use spate_logstore::ObjectStoreSettings;
use spate_runtime::StreamingSettings;

use crate::args::{MemoryArgs, WatchArgs};
use crate::error::CliError;

/// The batch interval when neither the flags nor the file give one.
pub(crate) const DEFAULT_BATCH: Duration = Duration::from_millis(1000);

/// What one command says of its job's settings.
pub(crate) struct JobFlags<'a> {
    pub(crate) batch_ms: Option<u64>,
    pub(crate) memory: &'a MemoryArgs,
    pub(crate) watch: &'a WatchArgs,
    pub(crate) object_store: &'a ObjectStoreSettings,
    pub(crate) max_records_per_batch: Option<u64>,
    pub(crate) max_bytes_per_batch: Option<u64>,
}

/// The job's settings: defaults, then the file, then the flags.
pub(crate) fn job_settings(flags: &JobFlags<'_>) -> Result<StreamingSettings, CliError> {
    let mut settings = StreamingSettings::new(DEFAULT_BATCH).with_object_store(flags.object_store.clone());
    if let Some(path) = &flags.memory.settings {
        settings = settings.overlay_file(path).map_err(|e| CliError::usage(format!("--settings: {e}")))?;
    }
    if let Some(ms) = flags.batch_ms {
        settings.batch_interval = Duration::from_millis(ms);
    }
    settings = flags.memory.apply(flags.watch.apply(settings));
    if let Some(records) = flags.max_records_per_batch {
        settings.max_records_per_batch = records;
    }
    if let Some(bytes) = flags.max_bytes_per_batch {
        settings.max_bytes_per_batch = Some(bytes);
    }
    settings.validate().map_err(|e| CliError::usage(e.to_string()))?;
    Ok(settings)
}
