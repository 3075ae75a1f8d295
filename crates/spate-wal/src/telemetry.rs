//! The log's operational metrics, through the `metrics` facade (nothing is
//! recorded until a program installs a recorder, as spate-runtime does for
//! `/metrics`): appends, bytes, syncs and sync latency, labelled with the
//! log's directory (`receivedData/0`, `receivedBlockMetadata`).
//!
//! The handles are registered when the log opens, so a recorder installed
//! after that does not see this log.

use std::path::Path;
use std::time::Duration;

use metrics::{Counter, Histogram, counter, histogram};

/// Records appended to a log.
pub(crate) const APPENDS: &str = "spate_wal_appends_total";
/// `fdatasync`s of a log's segments.
pub(crate) const SYNCS: &str = "spate_wal_syncs_total";
/// Bytes of records appended to a log (frames, without padding).
pub(crate) const BYTES: &str = "spate_wal_bytes_total";
/// How long one `fdatasync` took.
pub(crate) const SYNC_SECONDS: &str = "spate_wal_sync_seconds";

/// One log's metric handles.
pub(crate) struct WalMetrics {
    appends: Counter,
    syncs: Counter,
    bytes: Counter,
    sync_seconds: Histogram,
}

impl WalMetrics {
    /// The handles of the log in `dir`.
    pub(crate) fn for_dir(dir: &Path) -> Self {
        let log = log_label(dir);
        WalMetrics {
            appends: counter!(APPENDS, "log" => log.clone()),
            syncs: counter!(SYNCS, "log" => log.clone()),
            bytes: counter!(BYTES, "log" => log.clone()),
            sync_seconds: histogram!(SYNC_SECONDS, "log" => log),
        }
    }

    /// `records` records of `bytes` bytes were appended.
    pub(crate) fn appended(&self, records: u64, bytes: u64) {
        self.appends.increment(records);
        self.bytes.increment(bytes);
    }

    /// A sync that took `took` succeeded.
    pub(crate) fn synced(&self, took: Duration) {
        self.syncs.increment(1);
        self.sync_seconds.record(took.as_secs_f64());
    }
}

/// The `log` label of the log in `dir`: its directory's name, with the
/// parent's for a receiver log (`receivedData/<stream>`), so the logs of
/// two streams stay apart.
pub(crate) fn log_label(dir: &Path) -> String {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    match (name(dir), dir.parent().and_then(name)) {
        (Some(last), Some(parent)) if parent == "receivedData" => format!("{parent}/{last}"),
        (Some(last), _) => last,
        (None, _) => dir.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_label_is_the_directory_with_a_receiver_logs_stream() {
        assert_eq!(log_label(Path::new("/ck/receivedData/3")), "receivedData/3");
        assert_eq!(log_label(Path::new("/ck/receivedBlockMetadata")), "receivedBlockMetadata");
        assert_eq!(log_label(Path::new("relative/wal")), "wal");
        assert_eq!(log_label(Path::new("/")), "/");
    }
}
