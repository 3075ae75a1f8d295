//! The engine's metrics: the names every spate crate records through the
//! `metrics` facade, the Prometheus recorder that collects them for
//! `/metrics` (installed once per process and shared by every context in
//! it), and what the engine itself records per batch and at recovery.
//!
//! Without a recorder the facade's calls do nothing, so a program that
//! serves no metrics pays nothing; a program with a recorder of its own
//! (any `metrics` exporter) gets the same figures through it.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use spate_core::{BatchId, MemoryBudget};

use crate::error::RuntimeError;
use crate::progress::BatchProgress;
use crate::recovery::RecoveryReport;

/// Batches committed by this process.
pub(crate) const BATCHES_COMMITTED: &str = "spate_batches_committed_total";
/// Records set aside as late by event-time operators.
pub(crate) const LATE_RECORDS: &str = "spate_late_records_total";
/// From the start of a batch's processing to its commit, seconds.
pub(crate) const BATCH_PROCESSING_SECONDS: &str = "spate_batch_processing_seconds";
/// From a batch's time to the start of its processing, seconds.
pub(crate) const BATCH_SCHEDULING_DELAY_SECONDS: &str = "spate_batch_scheduling_delay_seconds";
/// The last committed batch id.
pub(crate) const LAST_COMMITTED_BATCH: &str = "spate_last_committed_batch";
/// The backpressure rate limit, records per second (absent while unlimited).
pub(crate) const BACKPRESSURE_RATE: &str = "spate_backpressure_rate";
/// 1 for this start's recovery verdict, 0 for the others.
pub(crate) const RECOVERY_VERDICT: &str = "spate_recovery_verdict";
/// The writer lock's epoch this process holds.
pub(crate) const CHECKPOINT_EPOCH: &str = "spate_checkpoint_epoch";
/// Records read, per source and partition (spate-kafka records its partitions).
pub(crate) const INPUT_RECORDS: &str = "spate_input_records_total";
/// Bytes read, per source and partition.
pub(crate) const INPUT_BYTES: &str = "spate_input_bytes_total";
/// Bytes of the shared memory budget the receivers' blocks hold.
pub(crate) const MEMORY_BUDGET_USED: &str = "spate_memory_budget_used_bytes";
/// The shared memory budget's limit (`--max-memory`), bytes.
pub(crate) const MEMORY_BUDGET_LIMIT: &str = "spate_memory_budget_limit_bytes";
/// Blocks that had to wait for room in the memory budget (backpressure).
pub(crate) const MEMORY_BUDGET_WAITS: &str = "spate_memory_budget_waits_total";
/// Bytes the received blocks spilled to disk take.
pub(crate) const SPILL_USED: &str = "spate_spill_used_bytes";
/// The spill limit (`--max-spill`), bytes.
pub(crate) const SPILL_LIMIT: &str = "spate_spill_limit_bytes";
/// Per partition, records not read yet (spate-kafka records it).
pub(crate) const KAFKA_CONSUMER_LAG: &str = "spate_kafka_consumer_lag";

/// Histogram buckets, seconds: from a fast `fdatasync` (0.1 ms) to a minute-long batch.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// How often histogram samples are folded into their buckets when nobody
/// scrapes (a scrape folds them too), so memory stays bounded.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

static EXPORTER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use: the global
/// `metrics` recorder can be set once per process, so every context in it
/// shares this one. Fails when another recorder was installed first.
pub(crate) fn exporter() -> Result<PrometheusHandle, RuntimeError> {
    EXPORTER
        .get_or_init(install)
        .clone()
        .map_err(|reason| RuntimeError::InvalidSetting { setting: "metrics_addr/ui_addr".to_string(), reason })
}

fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets(BUCKETS)
        .map_err(|e| format!("the metrics histogram buckets are refused: {e}"))?
        .install_recorder()
        .map_err(|e| {
            format!(
                "cannot install spate's Prometheus recorder ({e}): this process already has a `metrics` recorder; \
                 spate's figures go to that one, so serve them from it instead"
            )
        })?;
    describe();
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("spate-metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        })
        .map_err(|e| format!("could not start the metrics upkeep thread: {e}"))?;
    Ok(handle)
}

/// The text of `/metrics`: every figure now.
pub(crate) fn render(handle: &PrometheusHandle) -> String {
    handle.run_upkeep();
    handle.render()
}

/// The `# HELP` lines, for the metrics of every spate crate.
fn describe() {
    describe_counter!(BATCHES_COMMITTED, "Batches committed by this process.");
    describe_counter!(
        LATE_RECORDS,
        "Records event-time operators set aside as late: behind the watermark with their windows gone, or stamped \
         further ahead of the batch time than the watermarks allow."
    );
    describe_histogram!(BATCH_PROCESSING_SECONDS, "From the start of a batch's processing to its commit, seconds.");
    describe_histogram!(BATCH_SCHEDULING_DELAY_SECONDS, "From a batch's time to the start of its processing, seconds.");
    describe_gauge!(LAST_COMMITTED_BATCH, "The id of the last committed batch.");
    describe_gauge!(BACKPRESSURE_RATE, "The backpressure rate limit of the whole query, records per second.");
    describe_gauge!(RECOVERY_VERDICT, "1 for how this start found its checkpoint (fresh, rerun, resume), 0 otherwise.");
    describe_gauge!(CHECKPOINT_EPOCH, "The epoch of the checkpoint's writer lock this process holds.");
    describe_counter!(INPUT_RECORDS, "Records read, per source and partition (a receiver's partition: its stream id).");
    describe_counter!(INPUT_BYTES, "Bytes read, per source and partition (serialized blocks of a receiver).");
    describe_counter!("spate_wal_appends_total", "Records appended to a write-ahead log.");
    describe_counter!("spate_wal_syncs_total", "fdatasync calls of a write-ahead log.");
    describe_counter!("spate_wal_bytes_total", "Bytes of records appended to a write-ahead log.");
    describe_histogram!("spate_wal_sync_seconds", "How long one fdatasync of a write-ahead log took, seconds.");
    describe_gauge!("spate_blocks_in_memory", "Received blocks held in memory, per stream.");
    describe_gauge!(
        "spate_block_bytes_in_memory",
        "Estimated bytes of the received blocks held in memory, per stream."
    );
    describe_gauge!(MEMORY_BUDGET_USED, "Bytes of the memory budget (--max-memory) the received blocks hold.");
    describe_gauge!(MEMORY_BUDGET_LIMIT, "The memory budget (--max-memory), bytes.");
    describe_counter!(MEMORY_BUDGET_WAITS, "Blocks that waited for room in the memory budget (backpressure).");
    describe_gauge!(SPILL_USED, "Bytes the received blocks spilled to disk take (within --max-spill).");
    describe_gauge!(SPILL_LIMIT, "The spill limit (--max-spill), bytes.");
    describe_counter!("spate_spill_waits_total", "Blocks that waited for room in the full spill area (backpressure).");
    describe_gauge!(KAFKA_CONSUMER_LAG, "Records of a Kafka partition not read yet after the last planned batch.");
    describe_counter!("spate_kafka_transactions_committed_total", "Output transactions committed, per topic.");
    describe_counter!("spate_kafka_transactions_aborted_total", "Output transactions aborted, per topic.");
    describe_counter!(
        "spate_kafka_transactional_producers_reopened_total",
        "Transactional producers opened again after a fatal error (fenced when a transaction outlived its timeout)."
    );
    describe_counter!(
        "spate_kafka_broker_unavailable_total",
        "Kafka requests that found the broker unreachable or not ready (paused, restarting) and were tried again."
    );
    describe_counter!(
        "spate_object_store_unavailable_total",
        "Object store (S3) requests that found the store unreachable and were tried again."
    );
}

/// Records a committed batch.
pub(crate) fn record_batch(progress: &BatchProgress, labels: &[(String, String)]) {
    let labels: Vec<metrics::Label> = labels.iter().map(|(k, v)| metrics::Label::new(k.clone(), v.clone())).collect();
    counter!(BATCHES_COMMITTED, labels.clone()).increment(1);
    counter!(LATE_RECORDS, labels.clone()).increment(progress.late_records);
    histogram!(BATCH_PROCESSING_SECONDS, labels.clone()).record(progress.processing_time_ms as f64 / 1000.0);
    histogram!(BATCH_SCHEDULING_DELAY_SECONDS, labels.clone()).record(progress.scheduling_delay_ms as f64 / 1000.0);
    gauge!(LAST_COMMITTED_BATCH, labels.clone()).set(progress.batch_id.0 as f64);
    if let Some(rate) = progress.rate_limit {
        gauge!(BACKPRESSURE_RATE, labels).set(rate);
    }
}

/// Records how much of the memory budget is held and how often it held a receiver back.
pub(crate) fn record_memory(budget: &MemoryBudget, spill: &MemoryBudget) {
    gauge!(MEMORY_BUDGET_USED).set(budget.used() as f64);
    gauge!(MEMORY_BUDGET_LIMIT).set(budget.limit() as f64);
    counter!(MEMORY_BUDGET_WAITS).absolute(budget.waits());
    gauge!(SPILL_USED).set(spill.used() as f64);
    gauge!(SPILL_LIMIT).set(spill.limit() as f64);
}

/// The verdicts of [`RECOVERY_VERDICT`].
const VERDICTS: [&str; 3] = ["fresh", "rerun", "resume"];

/// How a start found its checkpoint: `fresh` (nothing logged), `rerun` (a
/// logged batch was not committed), `resume` (everything logged was committed).
pub(crate) fn verdict_of(report: &RecoveryReport) -> &'static str {
    match (report.rerun_batch, report.last_committed, report.resumed_at) {
        (Some(_), _, _) => "rerun",
        (None, None, BatchId(0)) => "fresh",
        _ => "resume",
    }
}

/// Records this start's recovery verdict and writer epoch.
pub(crate) fn record_recovery(report: &RecoveryReport) {
    let verdict = verdict_of(report);
    for name in VERDICTS {
        gauge!(RECOVERY_VERDICT, "verdict" => name).set(if name == verdict { 1.0 } else { 0.0 });
    }
    gauge!(CHECKPOINT_EPOCH).set(report.writer_epoch as f64);
    if let Some(last) = report.last_committed {
        gauge!(LAST_COMMITTED_BATCH).set(last.0 as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn report(last_committed: Option<u64>, rerun: Option<u64>, resumed_at: u64) -> RecoveryReport {
        RecoveryReport {
            checkpoint_dir: PathBuf::from("/ck"),
            writer_epoch: 2,
            took_over_from: None,
            last_committed: last_committed.map(BatchId),
            rerun_batch: rerun.map(BatchId),
            pending_batch_times: Vec::new(),
            resumed_at: BatchId(resumed_at),
            restored_operators: Vec::new(),
            new_operators: Vec::new(),
            dropped_operators: Vec::new(),
            replayed_for_state: Vec::new(),
            unrecoverable_blocks: Vec::new(),
            restore_ms: 0,
            replay_ms: 0,
        }
    }

    #[test]
    fn the_verdict_names_how_the_checkpoint_was_found() {
        assert_eq!(verdict_of(&report(None, None, 0)), "fresh");
        assert_eq!(verdict_of(&report(None, Some(0), 1)), "rerun");
        assert_eq!(verdict_of(&report(Some(4), Some(5), 6)), "rerun");
        assert_eq!(verdict_of(&report(Some(4), None, 5)), "resume");
    }
}
