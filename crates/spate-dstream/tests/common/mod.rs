//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use spate_core::{BatchId, Duration, Time};
use spate_dstream::{DStream, Data, Graph};

pub const INTERVAL: Duration = Duration::from_millis(1000);

pub fn t(batch: i64) -> Time {
    Time::from_millis(batch * 1000)
}

/// What an output received, by batch time.
pub type Collected<T> = Arc<Mutex<BTreeMap<Time, Vec<T>>>>;

/// Registers an output that records every batch it receives.
pub fn collect<T: Data>(stream: &DStream<T>) -> Collected<T> {
    let seen: Collected<T> = Arc::new(Mutex::new(BTreeMap::new()));
    let sink = Arc::clone(&seen);
    stream.foreach_batch(move |batch, info| {
        sink.lock().unwrap().insert(info.time, batch.iter().cloned().collect());
        Ok(())
    });
    seen
}

/// The records received at `time`, sorted.
pub fn sorted_at<T: Data + Ord>(seen: &Collected<T>, time: Time) -> Option<Vec<T>> {
    seen.lock().unwrap().get(&time).map(|records| {
        let mut records = records.clone();
        records.sort();
        records
    })
}

/// Runs batches 1..=n (times 1 s .. n s).
pub fn run(graph: &mut Graph, batches: std::ops::RangeInclusive<i64>) {
    for batch in batches {
        graph.run_batch(t(batch), BatchId(batch as u64)).unwrap();
    }
}

/// Each operator's whole state as [`Graph::snapshot_state_streamed`] writes it.
pub fn streamed_whole(graph: &mut Graph) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    graph
        .snapshot_state_streamed(|operator, state| {
            out.push((operator.to_string(), written(operator, state)?));
            Ok::<_, spate_dstream::DStreamError>(())
        })
        .unwrap();
    out
}

/// Each operator's changes, or whole state where it takes no changes, as
/// [`Graph::snapshot_state_changes_streamed`] writes them.
pub fn streamed_changes(graph: &mut Graph) -> Vec<(String, spate_dstream::StateSnapshot)> {
    let mut out = Vec::new();
    graph
        .snapshot_state_changes_streamed(|operator, state| {
            let bytes = written(operator, state)?;
            let snapshot = if state.is_changes() {
                spate_dstream::StateSnapshot::Changes(bytes)
            } else {
                spate_dstream::StateSnapshot::Whole(bytes)
            };
            out.push((operator.to_string(), snapshot));
            Ok::<_, spate_dstream::DStreamError>(())
        })
        .unwrap();
    out
}

/// What `state` writes to a file, checked against the length it reports.
fn written(operator: &str, state: &mut spate_dstream::StateWriter<'_>) -> Result<Vec<u8>, spate_dstream::DStreamError> {
    let mut file = std::io::Cursor::new(Vec::new());
    let written = state.write_to(&mut file)?;
    assert_eq!(written, file.get_ref().len() as u64, "{operator}");
    Ok(file.into_inner())
}
