//! Each transformation against a straightforward reference on generated data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{INTERVAL, collect, run, sorted_at, t};
use proptest::prelude::*;
use spate_core::{BatchId, Time};
use spate_dstream::{Batch, BatchInfo, FedSource, GraphBuilder, QueueSource};

/// Generated batches: each batch a few partitions of small numbers.
fn batches() -> impl Strategy<Value = Vec<Vec<Vec<u32>>>> {
    prop::collection::vec(prop::collection::vec(prop::collection::vec(0u32..40, 0..30), 1..4), 1..5)
}

fn builder() -> GraphBuilder {
    GraphBuilder::new(INTERVAL).partitions(3).workers(2).checkpointing(true)
}

fn flat(batch: &[Vec<u32>]) -> Vec<u32> {
    batch.iter().flatten().copied().collect()
}

fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn stateless_transformations_match_reference(input in batches()) {
        let b = builder();
        let queue = Arc::new(QueueSource::new());
        let source = b.input("numbers", Arc::clone(&queue));
        let mapped = collect(&source.map(|x| x * 3 + 1));
        let flat_mapped = collect(&source.flat_map(|x| vec![x; (x % 3) as usize]));
        let filtered = collect(&source.filter(|x| x % 2 == 0));
        let per_partition = collect(&source.map_partitions(|part| vec![part.iter().map(|x| u64::from(*x)).sum::<u64>()]));
        let unioned = collect(&source.union(&source.map(|x| x + 100)));
        let transformed = collect(&source.transform(|batch, time| {
            Ok(Batch::from_vec(batch.into_vec().into_iter().map(|x| (x, time.as_millis())).collect()))
        }));
        let repartitioned = source.repartition(4);
        let partition_sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sizes = Arc::clone(&partition_sizes);
        repartitioned.foreach_batch(move |batch, _| {
            sizes.lock().unwrap().push(batch.partitions().iter().map(Vec::len).collect::<Vec<_>>());
            Ok(())
        });
        let counted = collect(&source.count());
        let by_value = collect(&source.count_by_value());
        let mut graph = b.build().unwrap();
        for batch in &input {
            queue.push_partitions(batch.clone());
        }
        run(&mut graph, 1..=input.len() as i64);

        for (index, batch) in input.iter().enumerate() {
            let time = t(index as i64 + 1);
            let records = flat(batch);
            prop_assert_eq!(sorted_at(&mapped, time).unwrap(), sorted(records.iter().map(|x| x * 3 + 1).collect()));
            let expected_flat: Vec<u32> = records.iter().flat_map(|x| vec![*x; (x % 3) as usize]).collect();
            prop_assert_eq!(sorted_at(&flat_mapped, time).unwrap(), sorted(expected_flat));
            prop_assert_eq!(sorted_at(&filtered, time).unwrap(), sorted(records.iter().copied().filter(|x| x % 2 == 0).collect()));
            let sums: Vec<u64> = batch.iter().map(|p| p.iter().map(|x| u64::from(*x)).sum()).collect();
            prop_assert_eq!(sorted_at(&per_partition, time).unwrap(), sorted(sums));
            let mut both = records.clone();
            both.extend(records.iter().map(|x| x + 100));
            prop_assert_eq!(sorted_at(&unioned, time).unwrap(), sorted(both));
            let stamped: Vec<(u32, i64)> = records.iter().map(|x| (*x, time.as_millis())).collect();
            prop_assert_eq!(sorted_at(&transformed, time).unwrap(), sorted(stamped));
            prop_assert_eq!(sorted_at(&counted, time).unwrap(), vec![records.len() as u64]);
            let mut reference: BTreeMap<u32, u64> = BTreeMap::new();
            for x in &records {
                *reference.entry(*x).or_default() += 1;
            }
            prop_assert_eq!(sorted_at(&by_value, time).unwrap(), reference.into_iter().collect::<Vec<_>>());
            let sizes = partition_sizes.lock().unwrap()[index].clone();
            prop_assert_eq!(sizes.len(), 4);
            prop_assert_eq!(sizes.iter().sum::<usize>(), records.len());
            prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn keyed_transformations_match_reference(input in batches(), other in batches()) {
        let b = builder();
        let left_queue = Arc::new(QueueSource::new());
        let right_queue = Arc::new(QueueSource::new());
        let left = b.input("left", Arc::clone(&left_queue)).map(|x| (x % 7, x));
        let right = b.input("right", Arc::clone(&right_queue)).map(|x| (x % 5, x * 10));
        let values = collect(&left.map_values(|v| v + 1));
        let reduced = collect(&left.reduce_by_key(|a, b| a + b));
        let grouped = collect(&left.group_by_key().map(|(k, mut vs)| { vs.sort(); (k, vs) }));
        let combined = collect(&left.combine_by_key(|v| (v, 1u32), |acc: &mut (u32, u32), v| { acc.0 = acc.0.max(v); acc.1 += 1 }, |acc: &mut (u32, u32), o| { acc.0 = acc.0.max(o.0); acc.1 += o.1 }));
        let joined = collect(&left.join(&right));
        let outer = collect(&left.left_outer_join(&right));
        let mut graph = b.build().unwrap();
        let n = input.len().max(other.len());
        for i in 0..n {
            left_queue.push_partitions(input.get(i).cloned().unwrap_or_default());
            right_queue.push_partitions(other.get(i).cloned().unwrap_or_default());
        }
        run(&mut graph, 1..=n as i64);

        for i in 0..n {
            let time = t(i as i64 + 1);
            let l: Vec<(u32, u32)> = input.get(i).map(|b| flat(b)).unwrap_or_default().into_iter().map(|x| (x % 7, x)).collect();
            let r: Vec<(u32, u32)> = other.get(i).map(|b| flat(b)).unwrap_or_default().into_iter().map(|x| (x % 5, x * 10)).collect();
            prop_assert_eq!(sorted_at(&values, time).unwrap(), sorted(l.iter().map(|(k, v)| (*k, v + 1)).collect()));
            let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for (k, v) in &l {
                groups.entry(*k).or_default().push(*v);
            }
            let sums: Vec<(u32, u32)> = groups.iter().map(|(k, vs)| (*k, vs.iter().sum())).collect();
            prop_assert_eq!(sorted_at(&reduced, time).unwrap(), sums);
            let expected_groups: Vec<(u32, Vec<u32>)> = groups.iter().map(|(k, vs)| (*k, sorted(vs.clone()))).collect();
            prop_assert_eq!(sorted_at(&grouped, time).unwrap(), expected_groups);
            let combos: Vec<(u32, (u32, u32))> = groups.iter().map(|(k, vs)| (*k, (*vs.iter().max().unwrap(), vs.len() as u32))).collect();
            prop_assert_eq!(sorted_at(&combined, time).unwrap(), combos);
            let mut expected_join = Vec::new();
            let mut expected_outer = Vec::new();
            for (k, v) in &l {
                let matches: Vec<u32> = r.iter().filter(|(rk, _)| rk == k).map(|(_, w)| *w).collect();
                if matches.is_empty() {
                    expected_outer.push((*k, (*v, None)));
                }
                for w in matches {
                    expected_join.push((*k, (*v, w)));
                    expected_outer.push((*k, (*v, Some(w))));
                }
            }
            prop_assert_eq!(sorted_at(&joined, time).unwrap(), sorted(expected_join));
            prop_assert_eq!(sorted_at(&outer, time).unwrap(), sorted(expected_outer));
        }
    }
}

#[test]
fn a_stream_read_twice_gives_both_readers_every_record() {
    let b = builder();
    let queue = Arc::new(QueueSource::new());
    let source = b.input("words", Arc::clone(&queue));
    let upper = collect(&source.map(|w: String| w.to_uppercase()));
    let lengths = collect(&source.map(|w: String| w.len()));
    let mut graph = b.build().unwrap();
    queue.push(vec!["a".to_string(), "bb".to_string()]);
    run(&mut graph, 1..=1);
    assert_eq!(sorted_at(&upper, t(1)).unwrap(), vec!["A".to_string(), "BB".to_string()]);
    assert_eq!(sorted_at(&lengths, t(1)).unwrap(), vec![1, 2]);
}

#[test]
fn the_outputs_of_one_stream_share_its_batch_rather_than_copy_it() {
    let b = builder();
    let fed = Arc::new(FedSource::new());
    let source = b.input("receiver", Arc::clone(&fed));
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    for name in ["first", "second", "third"] {
        let seen = Arc::clone(&seen);
        source
            .foreach_batch(move |batch, _| {
                seen.lock().unwrap().push(batch.partitions()[0].as_ptr() as usize);
                Ok(())
            })
            .name(name);
    }
    let mut graph = b.build().unwrap();
    fed.feed(t(1), vec![vec![1u8, 2, 3]]);
    // The jobs are all generated before any runs, so every one holds the
    // batch at once: a copy would show as a second address.
    for job in graph.generate_jobs(t(1), BatchId(0), &Default::default()).unwrap() {
        job.run().unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|address| *address == seen[0]), "{seen:?}");
}

#[test]
fn outputs_get_batch_time_and_id_and_jobs_come_one_per_output() {
    let b = builder();
    let fed = Arc::new(FedSource::new());
    let source = b.input("receiver", Arc::clone(&fed));
    let infos = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = Arc::clone(&infos);
    source
        .foreach_batch(move |batch, info: BatchInfo| {
            sink.lock().unwrap().push((info, batch.len()));
            Ok(())
        })
        .name("sink");
    source.count().print(1).name("console");
    let mut graph = b.build().unwrap();
    fed.feed(t(5), vec![vec![1u8, 2, 3]]);
    let jobs = graph.generate_jobs(t(5), BatchId(9), &Default::default()).unwrap();
    let names: Vec<&str> = jobs.iter().map(|job| job.output()).collect();
    assert_eq!(names, vec!["sink", "console"]);
    for job in jobs {
        job.run().unwrap();
    }
    assert_eq!(*infos.lock().unwrap(), vec![(BatchInfo { time: t(5), batch_id: BatchId(9) }, 3)]);
}

#[test]
fn failing_output_names_operator_and_batch() {
    let b = builder();
    let queue = Arc::new(QueueSource::<u8>::new());
    b.input("in", Arc::clone(&queue)).foreach_batch(|_, _| Err("sink down".into())).name("bad-sink");
    let mut graph = b.build().unwrap();
    let err = graph.run_batch(t(1), BatchId(4)).unwrap_err().to_string();
    assert!(err.contains("bad-sink") && err.contains("batch 4") && err.contains("sink down"), "{err}");
}

#[test]
fn a_panicking_function_is_an_error_naming_the_operator() {
    let b = builder();
    let queue = Arc::new(QueueSource::<u8>::new());
    let stream = b.input("in", Arc::clone(&queue)).map(|x| if x == 3 { panic!("bad record") } else { x }).name("boom");
    collect(&stream);
    let mut graph = b.build().unwrap();
    queue.push_partitions(vec![vec![1, 2], vec![3]]);
    let err = graph.run_batch(t(1), BatchId(1)).unwrap_err().to_string();
    assert!(err.contains("boom") && err.contains("bad record"), "{err}");
}

#[test]
fn batch_times_must_be_aligned_and_increasing() {
    let b = builder();
    let queue = Arc::new(QueueSource::<u8>::new());
    collect(&b.input("in", Arc::clone(&queue)));
    let mut graph = b.build().unwrap();
    assert!(graph.run_batch(Time::from_millis(1500), BatchId(0)).is_err());
    graph.run_batch(t(2), BatchId(0)).unwrap();
    assert!(graph.run_batch(t(2), BatchId(1)).is_err());
    assert!(graph.run_batch(t(1), BatchId(1)).is_err());
    graph.run_batch(t(3), BatchId(1)).unwrap();
}

#[test]
fn save_as_text_files_writes_one_directory_per_batch_and_rewrites_on_rerun() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("out").to_string_lossy().into_owned();
    let make = |prefix: &str| {
        let b = builder();
        let queue = Arc::new(QueueSource::new());
        b.input("in", Arc::clone(&queue)).save_as_text_files(prefix, Some("txt"));
        (b.build().unwrap(), queue)
    };
    let (mut graph, queue) = make(&prefix);
    queue.push_partitions(vec![vec![1u32, 2], vec![3]]);
    run(&mut graph, 1..=1);
    // The batch runs again after a crash with the same records.
    let (mut again, queue) = make(&prefix);
    queue.push_partitions(vec![vec![1u32, 2], vec![3]]);
    run(&mut again, 1..=1);
    let batch_dir = dir.path().join("out-1000.txt");
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(&batch_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with("part-") {
            lines.extend(std::fs::read_to_string(path).unwrap().lines().map(str::to_string));
        }
    }
    assert_eq!(sorted(lines), vec!["1", "2", "3"]);
    assert!(batch_dir.join("_SUCCESS").exists());
}

#[test]
fn print_shows_the_first_records_under_the_batch_time() {
    let b = builder();
    let queue = Arc::new(QueueSource::new());
    let out = Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    b.input("in", Arc::clone(&queue)).print_to(2, Arc::clone(&out));
    let mut graph = b.build().unwrap();
    queue.push(vec![7u32, 8, 9]);
    run(&mut graph, 1..=1);
    let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
    assert!(text.contains("Time: 1000 ms"), "{text}");
    assert!(text.contains("7\n8\n...\n"), "{text}");
    assert!(!text.contains('9'), "{text}");
}

/// A replayable source reading from an in-memory log by offset range.
struct LogSource {
    log: Vec<u32>,
    next: std::sync::Mutex<usize>,
}

impl spate_dstream::InputSource<u32> for LogSource {
    fn is_replayable(&self) -> bool {
        true
    }
    fn plan(&self, _time: Time, limits: spate_dstream::BatchLimits) -> Result<Option<String>, spate_dstream::BoxError> {
        let mut next = self.next.lock().unwrap();
        let until = (*next + limits.max_records.unwrap_or(u64::MAX).min(1 << 20) as usize).min(self.log.len());
        let planned = format!("{{\"log\":{{\"0\":[{},{}]}}}}", *next, until);
        *next = until;
        Ok(Some(planned))
    }
    fn compute(&self, _time: Time, planned: Option<&str>) -> Result<Vec<Vec<u32>>, spate_dstream::BoxError> {
        let planned = planned.ok_or("no plan")?;
        let inner = planned.split('[').nth(1).and_then(|s| s.split(']').next()).ok_or("bad plan")?;
        let mut bounds = inner.split(',').map(|n| n.parse::<usize>());
        let (from, until) = (bounds.next().ok_or("bad plan")??, bounds.next().ok_or("bad plan")??);
        Ok(vec![self.log.get(from..until).ok_or("out of range")?.to_vec()])
    }
}

#[test]
fn replayable_source_plans_under_the_rate_limit_and_replays_logged_offsets() {
    let b = builder();
    let source = Arc::new(LogSource { log: (0..100).collect(), next: std::sync::Mutex::new(0) });
    let seen = collect(&b.input("log", Arc::clone(&source)));
    let mut graph = b.build().unwrap();
    assert!(graph.inputs()[0].replayable);
    let limits = BTreeMap::from([("log".to_string(), spate_dstream::BatchLimits::records(10))]);
    let planned = graph.plan(t(1), &limits).unwrap();
    assert_eq!(planned["log"], "{\"log\":{\"0\":[0,10]}}");
    for job in graph.generate_jobs(t(1), BatchId(0), &planned).unwrap() {
        job.run().unwrap();
    }
    assert_eq!(sorted_at(&seen, t(1)).unwrap(), (0..10).collect::<Vec<_>>());
    // Without its planned offsets a replayable input refuses to run.
    assert!(graph.generate_jobs(t(2), BatchId(1), &Default::default()).is_err());

    // After a crash: a new graph, handed the logged offsets of batch 0.
    let b = builder();
    let fresh = Arc::new(LogSource { log: (0..100).collect(), next: std::sync::Mutex::new(50) });
    let replayed = collect(&b.input("log", fresh));
    let mut graph = b.build().unwrap();
    for job in graph.generate_jobs(t(1), BatchId(0), &planned).unwrap() {
        job.run().unwrap();
    }
    assert_eq!(sorted_at(&replayed, t(1)).unwrap(), (0..10).collect::<Vec<_>>());
}

/// A user-defined key and value type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
struct Page {
    site: String,
    path: Vec<String>,
}

#[test]
fn user_types_work_as_keys_and_values_through_shuffles_and_windows() {
    let b = builder();
    let queue = Arc::new(QueueSource::new());
    let visits = b.input("visits", Arc::clone(&queue));
    let page = |site: &str, path: &str| Page { site: site.into(), path: vec![path.into()] };
    let counts = collect(&visits.map(|p: Page| (p, 1u32)).reduce_by_key_and_window_inv(
        |a, b| a + b,
        |a, b| a - b,
        common::INTERVAL.times(2),
        common::INTERVAL,
    ));
    let paired = collect(&visits.transform_with(&visits.count(), |pages, counts, _time| {
        let n = counts.into_vec().first().copied().unwrap_or(0);
        Ok(Batch::from_vec(pages.into_vec().into_iter().map(|p| (p, n)).collect()))
    }));
    let mut graph = b.build().unwrap();
    queue.push(vec![page("a", "/"), page("a", "/"), page("b", "/x")]);
    queue.push(vec![page("a", "/")]);
    run(&mut graph, 1..=2);
    assert_eq!(sorted_at(&counts, t(2)).unwrap(), vec![(page("a", "/"), 3), (page("b", "/x"), 1)]);
    assert_eq!(sorted_at(&paired, t(2)).unwrap(), vec![(page("a", "/"), 1)]);
}

/// A record that counts how often it is cloned.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Counted {
    value: u32,
    #[serde(skip)]
    clones: Arc<std::sync::atomic::AtomicUsize>,
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Counted { value: self.value, clones: Arc::clone(&self.clones) }
    }
}

#[test]
fn an_owned_output_takes_its_batch_without_a_copy_when_it_is_the_only_reader() {
    let run_with = |second_reader: bool| {
        let clones = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let b = builder();
        let queue = Arc::new(QueueSource::new());
        let stamped = Arc::clone(&clones);
        let records = b
            .input("numbers", Arc::clone(&queue))
            .map(move |value: u32| Counted { value, clones: Arc::clone(&stamped) });
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = Arc::clone(&received);
        records.foreach_batch_owned(move |batch: Batch<Counted>, _info: BatchInfo| {
            sink.lock().unwrap().extend(batch.into_vec().into_iter().map(|c| c.value));
            Ok(())
        });
        let other = second_reader.then(|| collect(&records.map(|c| c.value)));
        let mut graph = b.build().unwrap();
        queue.push(vec![1, 2, 3]);
        run(&mut graph, 1..=1);
        let mut values = received.lock().unwrap().clone();
        values.sort();
        assert_eq!(values, vec![1, 2, 3]);
        if let Some(other) = other {
            assert_eq!(sorted_at(&other, t(1)).unwrap(), vec![1, 2, 3]);
        }
        clones.load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(run_with(false), 0, "the only reader takes the batch as it is");
    // With another reader the batch may be copied; both get every record.
    run_with(true);
}
