//! The figures a log records for `/metrics` through the `metrics` facade:
//! appends, bytes, syncs and sync latency, labelled with the log's directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use metrics_exporter_prometheus::PrometheusBuilder;
use spate_core::Time;
use spate_wal::{FileWriteAheadLog, WalSettings, WriteAheadLog};

#[test]
fn appends_bytes_and_syncs_are_counted_under_the_logs_directory() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("receivedData").join("3");
    let recorder = PrometheusBuilder::new().set_buckets(&[0.001, 1.0]).unwrap().build_recorder();
    let handle = recorder.handle();
    // The log takes its metric handles when it opens.
    let log =
        metrics::with_local_recorder(&recorder, || FileWriteAheadLog::open(&log_dir, WalSettings::default())).unwrap();
    let handles: Vec<_> =
        (0..3u8).map(|i| log.write(&vec![i; 100 + usize::from(i)], Time::from_millis(1000)).unwrap()).collect();
    let framed: u64 = handles.iter().map(|h| u64::from(h.length)).sum();
    assert!(framed > 303, "frames carry a header");
    handle.run_upkeep();
    let text = handle.render();
    let label = "{log=\"receivedData/3\"}";
    assert!(text.contains(&format!("spate_wal_appends_total{label} 3\n")), "{text}");
    assert!(text.contains(&format!("spate_wal_bytes_total{label} {framed}\n")), "{text}");
    // The default policy syncs every write.
    assert!(text.contains(&format!("spate_wal_syncs_total{label} 3\n")), "{text}");
    assert!(text.contains(&format!("spate_wal_sync_seconds_count{label} 3\n")), "{text}");
    log.close().unwrap();
}
