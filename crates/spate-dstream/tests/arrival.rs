//! Blocks processed as they arrive give the same results as the whole batch
//! computed at its end, for random records, block boundaries and mixes of
//! processed and raw blocks, through a per-batch count and a window, with
//! the per-key aggregates themselves combining blocks on arrival; and so
//! do blocks read in place from their encoded bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{Collected, INTERVAL, collect, run, sorted_at, t};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use spate_core::Duration;
use spate_dstream::{
    ArrivalStage, DStream, FedSource, GraphBuilder, InPlace, InputSource, ProcessedBlock, QueueSource, Views,
};

/// One batch: its records cut into blocks, and for each block whether it
/// was processed on arrival (true) or handed over raw at the batch end.
type Blocks = Vec<(Vec<u16>, bool)>;

fn batches() -> impl Strategy<Value = Vec<Blocks>> {
    let block = (prop::collection::vec(0u16..30, 0..40), any::<bool>());
    prop::collection::vec(prop::collection::vec(block, 0..6), 1..8)
}

/// Word counts by batch time.
type Counts<K = u16> = Collected<(K, u64)>;

/// The job: each partition's words counted (the demo's shape), summed per
/// batch and over a 3-batch window.
fn job(words: &DStream<u16>) -> Vec<Counts> {
    let counted = words.map_partitions(|part| {
        let mut counts: BTreeMap<u16, u64> = BTreeMap::new();
        for word in part {
            *counts.entry(word).or_default() += 1;
        }
        counts.into_iter().collect::<Vec<_>>()
    });
    let per_batch = counted.reduce_by_key(|a, b| a + b);
    let windowed = per_batch.reduce_by_key_and_window(|a, b| a + b, Duration::from_secs(3), INTERVAL);
    vec![collect(&per_batch), collect(&windowed)]
}

fn builder() -> GraphBuilder {
    // Checkpointing declared for the window with an inverse.
    GraphBuilder::new(INTERVAL).partitions(3).workers(2).checkpointing(true)
}

/// The job of [`job`] behind a chain of record-wise operators: the whole
/// chain runs on arrival.
fn chained_job(words: &DStream<u16>) -> Vec<Counts> {
    job(&words.filter(|w| w % 5 != 0).map(|w| w / 2).flat_map(|w| [w, w + 7]))
}

/// A job as a user writes it: words paired with a count and reduced by key,
/// with no per-partition count of its own; the aggregate combines each
/// block by key as it arrives.
fn keyed_job(words: &DStream<u16>) -> Vec<Counts> {
    vec![collect(&words.map(|w| (w % 13, 1u64)).reduce_by_key(|a, b| a + b))]
}

/// A window reading the pairs directly: it reduces each block on arrival.
fn windowed_job(words: &DStream<u16>) -> Vec<Counts> {
    let pairs = words.filter(|w| w % 4 != 0).map(|w| (w, 1u64));
    vec![collect(&pairs.reduce_by_key_and_window(|a, b| a + b, Duration::from_secs(3), INTERVAL))]
}

/// The window with an inverse.
fn inverse_window_job(words: &DStream<u16>) -> Vec<Counts> {
    let pairs = words.map(|w| (w % 7, 1u64));
    vec![collect(&pairs.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, Duration::from_secs(3), INTERVAL))]
}

/// A per-batch aggregate, and the window with an inverse over it as its
/// only reader, which merges the aggregate's blocks combined on arrival
/// itself. The aggregate (a maximum) is not the window's sum, so a block's
/// value merged with the wrong function, or not at all, shows.
fn aggregated_then_windowed_job(words: &DStream<u16>) -> Vec<Counts> {
    let counts = words.map(|w| (w % 11, u64::from(w))).reduce_by_key(|a, b| *a.max(b));
    vec![collect(&counts.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, Duration::from_secs(3), INTERVAL))]
}

/// The same over keys nearly all distinct in a block: each block is split
/// for the window as it comes, without combining it first.
fn distinct_keys_then_windowed_job(words: &DStream<u16>) -> Vec<Counts> {
    let counts = words.map(|w| (w, u64::from(w) + 1)).reduce_by_key(|a, b| *a.max(b));
    vec![collect(&counts.reduce_by_key_and_window_inv(|a, b| a + b, |a, b| a - b, Duration::from_secs(3), INTERVAL))]
}

/// The largest word of each residue, combined by key from the input itself.
fn combined_job(words: &DStream<u16>) -> Vec<Counts> {
    let pairs = words.map(|w| (w % 5, u64::from(w)));
    vec![collect(&pairs.combine_by_key(
        |v| v,
        |max: &mut u64, v| *max = (*max).max(v),
        |max, other| *max = (*max).max(other),
    ))]
}

/// Runs `job` over `input` once with blocks processed on arrival (by the
/// stage named `operator`) or handed over raw as `input` says, once over
/// whole batches, and compares every output; returns the pipelined
/// results of the first. Every block arrives before the first batch runs.
fn check_pipelined(
    input: &[Blocks],
    job: fn(&DStream<u16>) -> Vec<Counts>,
    operator: &str,
) -> Result<Counts, TestCaseError> {
    check_arrivals(input, job, Some(operator), input.len())
}

/// A job whose window frees keys (those whose count fell to zero): the
/// window looks a block's keys up in its state as the block arrives.
fn freeing_window_job(words: &DStream<u16>) -> Vec<Counts> {
    let counts = words.map(|w| (w, 1u64)).reduce_by_key(|a, b| a + b);
    let windowed = counts.reduce_by_key_and_window_inv_filtered(
        |a, b| a + b,
        |a, b| a - b,
        Duration::from_secs(3),
        INTERVAL,
        |_, count| *count > 0,
    );
    vec![collect(&windowed)]
}

/// As [`check_pipelined`], with the blocks arriving as they do in a
/// running job: each batch's blocks are processed `ahead` batches before
/// the batch runs, the batches before it running in between (their
/// slides free keys while the blocks' keys are held).
fn check_interleaved(
    input: &[Blocks],
    job: fn(&DStream<u16>) -> Vec<Counts>,
    ahead: usize,
) -> Result<(), TestCaseError> {
    check_arrivals(input, job, None, ahead).map(drop)
}

/// Batch `n`'s blocks arrive, then batch `n - ahead` runs; `operator`
/// names the arrival stage when given.
fn check_arrivals(
    input: &[Blocks],
    job: fn(&DStream<u16>) -> Vec<Counts>,
    operator: Option<&str>,
    ahead: usize,
) -> Result<Counts, TestCaseError> {
    let fed = Arc::new(FedSource::new());
    let b = builder();
    let outputs = job(&b.input("words", Arc::clone(&fed)));
    let mut pipelined = b.build().unwrap();
    let stage = fed.arrival_stage().expect("the graph hands the counting to the fed source");
    if let Some(operator) = operator {
        prop_assert_eq!(stage.operator(), operator);
    }

    let queue = Arc::new(QueueSource::new());
    let b = builder();
    let references = job(&b.input("words", Arc::clone(&queue)));
    let mut whole = b.build().unwrap();
    prop_assert!(!queue.set_arrival_stage(stage.clone()), "a queue computes at the batch end");

    let batches = input.len() as i64;
    for (index, blocks) in input.iter().enumerate() {
        let time = t(index as i64 + 1);
        let processed =
            blocks.iter().filter(|(_, early)| *early).map(|(records, _)| process_in_chunks(&stage, records));
        stage.deliver(time, merge_leading(&stage, processed.collect()));
        fed.feed(time, blocks.iter().filter(|(_, early)| !*early).map(|(records, _)| records.clone()).collect());
        queue.push_partitions(blocks.iter().map(|(records, _)| records.clone()).collect());
        let due = index as i64 + 1 - ahead as i64;
        if due >= 1 {
            run(&mut pipelined, due..=due);
        }
    }
    run(&mut pipelined, (batches + 1 - ahead as i64).max(1)..=batches);
    run(&mut whole, 1..=batches);
    for batch in 1..=batches {
        for (output, reference) in outputs.iter().zip(&references) {
            prop_assert_eq!(sorted_at(output, t(batch)), sorted_at(reference, t(batch)), "batch {}", batch);
        }
    }
    Ok(Arc::clone(&outputs[0]))
}

/// `blocks`, consecutive blocks' results of one batch, with all but the
/// last third of them merged by key into one as the runtime merges them
/// while they wait, when the stage merges by key (the rest as they are).
fn merge_leading(stage: &ArrivalStage<u16>, mut blocks: Vec<ProcessedBlock>) -> Vec<ProcessedBlock> {
    if !stage.merges_by_key() || blocks.len() < 2 {
        return blocks;
    }
    let rest = blocks.split_off(blocks.len() - blocks.len() / 3);
    let mut leading = blocks.into_iter();
    let first = leading.next().expect("at least one block");
    let merged = leading.fold(first, |merged, then| {
        stage.merge_by_key(merged, then).unwrap_or_else(|_| panic!("{} merges by key", stage.operator()))
    });
    std::iter::once(merged).chain(rest).collect()
}

/// A block processed as a Kafka stream reads it: a chunkable stage in two
/// chunks joined, any other whole.
fn process_in_chunks(stage: &ArrivalStage<u16>, records: &[u16]) -> ProcessedBlock {
    if !stage.is_chunkable() {
        return stage.process(records.to_vec());
    }
    let (first, second) = records.split_at(records.len() / 2);
    stage.join(vec![stage.process(first.to_vec()), stage.process(second.to_vec())])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn blocks_processed_on_arrival_give_the_whole_batch_result(input in batches()) {
        let per_batch = check_pipelined(&input, job, "map_partitions-1 > reduce_by_key-2")?;
        // The results are the counts themselves, not only equal to each other.
        let last = input.len() as i64;
        let mut expected: BTreeMap<u16, u64> = BTreeMap::new();
        for (records, _) in &input[input.len() - 1] {
            for word in records {
                *expected.entry(*word).or_default() += 1;
            }
        }
        prop_assert_eq!(sorted_at(&per_batch, t(last)).unwrap_or_default(), expected.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_chain_of_partition_local_operators_runs_on_arrival_and_gives_the_whole_batch_result(input in batches()) {
        check_pipelined(&input, chained_job, "filter-1 > map-2 > flat_map-3 > map_partitions-4 > reduce_by_key-5")?;
    }

    #[test]
    fn per_key_aggregates_combine_blocks_on_arrival_and_give_the_whole_batch_result(input in batches()) {
        check_pipelined(&input, keyed_job, "map-1 > reduce_by_key-2")?;
        check_pipelined(&input, windowed_job, "filter-1 > map-2 > reduce_by_key_and_window-3")?;
        check_pipelined(&input, inverse_window_job, "map-1 > reduce_by_key_and_window_inv-2")?;
        check_pipelined(&input, aggregated_then_windowed_job, "map-1 > reduce_by_key-2")?;
        check_pipelined(&input, distinct_keys_then_windowed_job, "map-1 > reduce_by_key-2")?;
        check_pipelined(&input, combined_job, "map-1 > combine_by_key-2")?;
    }

    #[test]
    fn a_window_looking_keys_up_as_blocks_arrive_gives_the_whole_batch_result(
        input in batches(),
        ahead in 0usize..3,
    ) {
        check_interleaved(&input, aggregated_then_windowed_job, ahead)?;
        check_interleaved(&input, freeing_window_job, ahead)?;
    }
}

/// How a block of `String` words reaches the batch: read in place from its
/// encoded bytes on arrival, processed from decoded records on arrival, or
/// handed over raw at the batch end.
#[derive(Debug, Clone, Copy)]
enum Arrival {
    Encoded,
    Decoded,
    Raw,
}

type StringBlocks = Vec<(Vec<String>, Arrival)>;

fn string_batches() -> impl Strategy<Value = Vec<StringBlocks>> {
    let word = (0u16..30, 0usize..5).prop_map(|(n, pad)| format!("w{n}{}", "é".repeat(pad)));
    let arrival = prop_oneof![Just(Arrival::Encoded), Just(Arrival::Decoded), Just(Arrival::Raw)];
    let block = (prop::collection::vec(word, 0..40), arrival);
    prop::collection::vec(prop::collection::vec(block, 0..6), 1..6)
}

/// A block's records in the receiver's encoded form: a varint count, then
/// each record as [`InPlace::write_view`] writes it.
fn encoded(records: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    spate_core::write_varint(records.len() as u64, &mut out);
    for record in records {
        String::write_view(record, &mut out);
    }
    out
}

/// [`job`]'s per-batch count, its partitions counted over views.
fn count_in_place(words: &DStream<String>) -> Counts<String> {
    let counted = words.map_partitions_in_place(|part: Views<'_, String>| {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for word in part {
            match counts.get_mut(word) {
                Some(n) => *n += 1,
                None => {
                    counts.insert(word.to_owned(), 1);
                }
            }
        }
        counts.into_iter().collect::<Vec<_>>()
    });
    collect(&counted.reduce_by_key(|a, b| a + b))
}

/// The reference: the same count over owned records.
fn count_whole(words: &DStream<String>) -> Counts<String> {
    let counted = words.map_partitions(|part| {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for word in part {
            *counts.entry(word).or_default() += 1;
        }
        counts.into_iter().collect::<Vec<_>>()
    });
    collect(&counted.reduce_by_key(|a, b| a + b))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn blocks_read_in_place_give_the_whole_batch_result(input in string_batches()) {
        let fed = Arc::new(FedSource::new());
        let b = builder();
        let counts = count_in_place(&b.input("words", Arc::clone(&fed)));
        let mut pipelined = b.build().unwrap();
        let stage = fed.arrival_stage().expect("the graph hands the counting to the fed source");
        prop_assert!(stage.reads_in_place());

        let queue = Arc::new(QueueSource::new());
        let b = builder();
        let reference = count_whole(&b.input("words", Arc::clone(&queue)));
        let mut whole = b.build().unwrap();

        for (index, blocks) in input.iter().enumerate() {
            let time = t(index as i64 + 1);
            let mut processed = Vec::new();
            let mut raw = Vec::new();
            for (records, arrival) in blocks {
                match arrival {
                    Arrival::Encoded => {
                        let block = stage.process_payload(&encoded(records)).expect("reads in place");
                        let block = block.unwrap();
                        prop_assert_eq!(block.records_in(), records.len());
                        processed.push(block);
                    }
                    Arrival::Decoded => processed.push(stage.process(records.clone())),
                    Arrival::Raw => raw.push(records.clone()),
                }
            }
            stage.deliver(time, processed);
            fed.feed(time, raw);
            queue.push_partitions(blocks.iter().map(|(records, _)| records.clone()).collect());
        }
        let batches = 1..=input.len() as i64;
        run(&mut pipelined, batches.clone());
        run(&mut whole, batches.clone());
        for batch in batches {
            let expected = sorted_at(&reference, t(batch));
            prop_assert_eq!(sorted_at(&counts, t(batch)), expected);
        }
    }
}

#[test]
fn a_payload_whose_records_do_not_read_is_an_error_not_a_short_block() {
    let fed = Arc::new(FedSource::<String>::new());
    let b = builder();
    count_in_place(&b.input("words", Arc::clone(&fed)));
    b.build().unwrap();
    let stage = fed.arrival_stage().unwrap();
    let words: Vec<String> = ["one", "two", "three"].map(String::from).to_vec();
    let whole = encoded(&words);
    assert_eq!(stage.process_payload(&whole).unwrap().unwrap().records_in(), 3);
    let cut_short = &whole[..whole.len() - 2];
    assert!(stage.process_payload(cut_short).unwrap().is_err(), "a record cut short");
    let mut not_utf8 = whole.clone();
    let last = not_utf8.len() - 1;
    not_utf8[last] = 0xff;
    assert!(stage.process_payload(&not_utf8).unwrap().is_err(), "a string that is not UTF-8");
    let mut trailing = whole;
    trailing.push(0);
    assert!(stage.process_payload(&trailing).unwrap().is_err(), "bytes after the last record");
}

#[test]
fn an_input_read_by_two_operators_or_a_whole_batch_one_is_computed_at_the_batch_end() {
    let fed = Arc::new(FedSource::<u16>::new());
    let b = builder();
    let words = b.input("words", Arc::clone(&fed));
    collect(&words.map(|w| w + 1));
    collect(&words.filter(|w| *w > 3));
    b.build().unwrap();
    assert!(fed.arrival_stage().is_none(), "two readers: the batch is computed once and shared");

    let fed = Arc::new(FedSource::<u16>::new());
    let b = builder();
    collect(&b.input("words", Arc::clone(&fed)).repartition(2));
    b.build().unwrap();
    assert!(fed.arrival_stage().is_none(), "a repartition needs the whole batch");
}

#[test]
fn an_aggregate_reading_a_fed_input_directly_combines_each_block_on_arrival() {
    let fed = Arc::new(FedSource::<(String, u64)>::new());
    let b = builder();
    let counts = collect(&b.input("pairs", Arc::clone(&fed)).reduce_by_key(|a, b| a + b));
    let mut graph = b.build().unwrap();
    let stage = fed.arrival_stage().expect("reduce_by_key takes the blocks on arrival");
    assert_eq!((stage.operator(), stage.is_chunkable()), ("reduce_by_key-1", true));
    let pairs = |words: &[&str]| words.iter().map(|w| (w.to_string(), 1u64)).collect::<Vec<_>>();
    let first = stage.process(pairs(&["a", "b", "a"]));
    assert_eq!(first.records_in(), 3);
    // Two chunks of one block join into the block's combined counts.
    let second = stage.join(vec![stage.process(pairs(&["b"])), stage.process(pairs(&["c", "b"]))]);
    assert_eq!(second.records_in(), 3);
    stage.deliver(t(1), vec![first, second]);
    fed.feed(t(1), vec![pairs(&["c", "a"])]);
    run(&mut graph, 1..=1);
    let expected: Vec<(String, u64)> = [("a", 3), ("b", 3), ("c", 2)].map(|(w, n)| (w.to_string(), n)).to_vec();
    assert_eq!(sorted_at(&counts, t(1)), Some(expected));
}
