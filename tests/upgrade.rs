//! Upgrading a running pipeline, across the crates as a user meets them:
//! run with a checkpoint, stop, change the code (add an output and a new
//! stateful operator, keep the named state), start again, and the named
//! state resumes where it was. An incompatible change (the state's type) is
//! refused with an error that names the operator, and changes nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use serde_json::json;
use spate::core::{BatchId, Duration, ManualClock, Time};
use spate::dstream::{BatchLimits, BoxError, DStream, InputSource};
use spate::logstore::Verdict;
use spate::receiver::WordGenerator;
use spate::runtime::{PipelineBuilder, RuntimeError, StreamingContext, StreamingSettings};

const WAIT: StdDuration = StdDuration::from_secs(60);
const START: i64 = 1_700_000_000_000;
const SEED: u64 = 11;
const PER_BATCH: u64 = 50;

/// The seed's words, replayable by position: a batch plans `from..until`.
#[derive(Debug)]
struct Words {
    generator: WordGenerator,
    position: Mutex<u64>,
}

impl Words {
    fn new() -> Arc<Self> {
        Arc::new(Words { generator: WordGenerator::new(SEED), position: Mutex::new(0) })
    }
}

fn range_of(planned: &str) -> Result<(u64, u64), BoxError> {
    let v: serde_json::Value = serde_json::from_str(planned)?;
    Ok((v["from"].as_u64().ok_or("no from")?, v["until"].as_u64().ok_or("no until")?))
}

impl InputSource<String> for Words {
    fn is_replayable(&self) -> bool {
        true
    }

    fn plan(&self, _time: Time, limits: BatchLimits) -> Result<Option<String>, BoxError> {
        let mut position = self.position.lock().unwrap();
        let until = *position + limits.max_records.map_or(PER_BATCH, |m| m.min(PER_BATCH));
        let planned = json!({"from": *position, "until": until}).to_string();
        *position = until;
        Ok(Some(planned))
    }

    fn compute(&self, _time: Time, planned: Option<&str>) -> Result<Vec<Vec<String>>, BoxError> {
        let (from, until) = range_of(planned.ok_or("no plan")?)?;
        Ok(vec![self.generator.words(from, usize::try_from(until - from)?)])
    }
}

type Totals = Arc<Mutex<BTreeMap<BatchId, BTreeMap<String, u64>>>>;

fn words_input(p: &mut PipelineBuilder, source: &Arc<Words>) -> DStream<String> {
    let resume = Arc::clone(source);
    let on_resume = Box::new(move |offsets: &str| {
        *resume.position.lock().map_err(|e| e.to_string())? = range_of(offsets).map_err(|e| e.to_string())?.1;
        Ok(())
    });
    p.replayable_input("words", Arc::clone(source), Some(on_resume), None)
}

/// Version 1: running totals per word, in the named state "word-totals".
fn version_1(p: &mut PipelineBuilder, totals: &Totals) -> DStream<(String, u64)> {
    let words = words_input(p, &Words::new());
    let state = words
        .map(|w| (w, 1u64))
        .update_state_by_key(|new: Vec<u64>, old: Option<u64>| Some(old.unwrap_or(0) + new.iter().sum::<u64>()))
        .name("word-totals");
    let totals = Arc::clone(totals);
    state
        .foreach_batch(move |batch, info| {
            totals.lock().map_err(|e| e.to_string())?.insert(info.batch_id, batch.iter().cloned().collect());
            Ok(())
        })
        .name("totals-out");
    state
}

/// Version 2: the same named state, plus an output and a new stateful operator.
fn version_2(p: &mut PipelineBuilder, totals: &Totals, batch_sizes: &Arc<Mutex<Vec<(BatchId, u64)>>>) {
    let state = version_1(p, totals);
    let sizes = Arc::clone(batch_sizes);
    state
        .count()
        .foreach_batch(move |batch, info| {
            sizes.lock().map_err(|e| e.to_string())?.push((info.batch_id, batch.iter().sum()));
            Ok(())
        })
        .name("distinct-words-out");
    let batches_seen = state
        .map(|_| ((), 1u64))
        .update_state_by_key(|new: Vec<u64>, old: Option<u64>| Some(old.unwrap_or(0) + new.len().min(1) as u64))
        .name("batches-seen");
    batches_seen.foreach_batch(|_, _| Ok(())).name("batches-seen-out");
}

/// Version 3 (incompatible): the named state now holds another type.
fn version_3(p: &mut PipelineBuilder) {
    let words = words_input(p, &Words::new());
    let state = words
        .map(|w| (w, 1u64))
        .update_state_by_key(|new: Vec<u64>, old: Option<String>| {
            Some(format!("{}{}", old.unwrap_or_default(), new.len()))
        })
        .name("word-totals");
    state.foreach_batch(|_, _| Ok(())).name("totals-out");
    state
        .map(|_| ((), 1u64))
        .update_state_by_key(|new: Vec<u64>, old: Option<u64>| Some(old.unwrap_or(0) + new.len().min(1) as u64))
        .name("batches-seen")
        .foreach_batch(|_, _| Ok(()))
        .name("batches-seen-out");
}

fn settings(clock: &ManualClock) -> StreamingSettings {
    StreamingSettings::new(Duration::from_secs(1))
        .with_clock(Arc::new(clock.clone()))
        .with_checkpoint_interval(Duration::from_secs(2))
}

fn run_batches(ctx: &mut StreamingContext, clock: &ManualClock, batches: std::ops::Range<u64>) {
    ctx.start().unwrap();
    for batch in batches {
        clock.advance(Duration::from_secs(1));
        assert!(ctx.await_committed(BatchId(batch), WAIT), "batch {batch}: {:?}", ctx.failure());
    }
    ctx.stop_handle().stop_gracefully();
}

/// The totals of the first `batches` batches, from the seed alone.
fn expected_totals(batches: u64) -> BTreeMap<String, u64> {
    let mut totals = BTreeMap::new();
    for word in WordGenerator::new(SEED).words(0, usize::try_from(batches * PER_BATCH).unwrap()) {
        *totals.entry(word).or_insert(0) += 1;
    }
    totals
}

#[test]
fn an_added_output_and_operator_keep_the_named_state_and_an_incompatible_change_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Time::from_millis(START));
    let totals = Totals::default();

    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        version_1(p, &totals);
        Ok(())
    })
    .unwrap();
    run_batches(&mut ctx, &clock, 0..5);
    let stopped = ctx.await_termination().unwrap();
    let last_v1 = stopped.last_committed.unwrap();
    assert!(stopped.graceful);
    assert_eq!(totals.lock().unwrap()[&last_v1], expected_totals(last_v1.0 + 1));

    let sizes = Arc::new(Mutex::new(Vec::new()));
    let mut ctx = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        version_2(p, &totals, &sizes);
        Ok(())
    })
    .unwrap();
    let report = ctx.recovery().unwrap().clone();
    let restored: Vec<&str> = report.restored_operators.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(restored, ["word-totals"], "{report}");
    assert!(report.new_operators.iter().any(|o| o == "batches-seen"), "{report:?}");
    assert_eq!(Some(report.resumed_at), last_v1.next());
    let first_v2 = report.resumed_at.0;
    run_batches(&mut ctx, &clock, first_v2..first_v2 + 3);
    let last_v2 = ctx.await_termination().unwrap().last_committed.unwrap();

    // The totals went on from version 1's: every word of every batch, once.
    let totals_now = totals.lock().unwrap()[&last_v2].clone();
    assert_eq!(totals_now, expected_totals(last_v2.0 + 1));
    let sizes = sizes.lock().unwrap().clone();
    assert_eq!(sizes.first().map(|s| s.0), Some(BatchId(first_v2)), "the added output starts with the upgrade");
    assert_eq!(sizes.iter().find(|s| s.0 == last_v2).map(|s| s.1), Some(totals_now.len() as u64));

    // An incompatible change is refused and changes nothing.
    let before = spate::logstore::inspect(dir.path()).unwrap();
    let refused = StreamingContext::get_or_create(dir.path(), settings(&clock), |p| {
        version_3(p);
        Ok(())
    })
    .unwrap_err();
    assert!(matches!(refused, RuntimeError::IncompatibleGraph { .. }), "{refused:?}");
    assert!(refused.to_string().contains("word-totals"), "{refused}");
    let after = spate::logstore::inspect(dir.path()).unwrap();
    assert_eq!(after, before);
    assert!(matches!(after, Verdict::Resume { next, .. } if Some(next) == last_v2.next()));
}
