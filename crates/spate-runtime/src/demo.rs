//! The demo pipeline: seeded random words from the generator receiver
//! (write-ahead log on), counted per batch and over a sliding window
//! (`reduce_by_key_and_window` with an inverse), the top words of each
//! window handed to a callback (and, when asked, all of its counts to
//! another, such as a file sink), and an exactly-once file output keyed by
//! batch id that [`verify_output`] checks against the generator's seed.
//! The output is owner-only (0700 directories, 0600 files), as everything
//! under a checkpoint is: it is usually inside one.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Duration, Time};
use spate_dstream::{BatchInfo, BoxError, KeyHashMap, Views};
use spate_receiver::{GeneratorReceiver, GeneratorSettings, WordGenerator};

use crate::context::{PipelineBuilder, StreamingContext};
use crate::error::RuntimeError;
use crate::inputs::ReceiverSettings;
use crate::settings::StreamingSettings;

/// The top words of one window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopWords {
    /// The batch that closed the window.
    pub batch_id: BatchId,
    /// Its time (the window's end).
    pub batch_time: Time,
    /// The most frequent words, most frequent first (ties by word).
    pub words: Vec<(String, u64)>,
}

/// Called with the top words of every window.
pub type TopWordsCallback = Arc<dyn Fn(&TopWords) + Send + Sync>;

/// Called in the window output with every word count of a window and the
/// batch that closed it (its time is the window's end); an error fails the
/// batch, which then runs again: a sink that writes them must be idempotent
/// by batch (`spate-files` is).
pub type WindowCountsCallback = Arc<dyn Fn(&[(String, u64)], BatchInfo) -> Result<(), BoxError> + Send + Sync>;

/// How the demo runs.
#[derive(Clone)]
pub struct DemoSettings {
    /// The generator's seed: the same seed gives the same words.
    pub seed: u64,
    /// Words per second (`None`: as fast as the engine takes them).
    pub rate: Option<u64>,
    /// Stop generating after this many words (`None`: never).
    pub total_records: Option<u64>,
    /// The receiver write-ahead log (on by default: nothing is lost in a crash).
    pub write_ahead_log: bool,
    /// The window length (30 s).
    pub window: Duration,
    /// The window slide (2 s).
    pub slide: Duration,
    /// How many top words each window reports.
    pub top_n: usize,
    /// Called with each window's top words.
    pub on_top_words: Option<TopWordsCallback>,
    /// Where the exactly-once output goes: `batch-<N>.json` per batch
    /// (the batch's word counts) and `window-<N>.json` per window; `None`: no files.
    pub output_dir: Option<PathBuf>,
    /// Called with every word count of each window, before its top words.
    pub on_window_counts: Option<WindowCountsCallback>,
}

impl fmt::Debug for DemoSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DemoSettings")
            .field("seed", &self.seed)
            .field("rate", &self.rate)
            .field("total_records", &self.total_records)
            .field("write_ahead_log", &self.write_ahead_log)
            .field("window", &self.window)
            .field("slide", &self.slide)
            .field("top_n", &self.top_n)
            .field("output_dir", &self.output_dir)
            .finish_non_exhaustive()
    }
}

impl DemoSettings {
    /// The demo of `seed`: unlimited words, WAL on, 30 s window sliding by 2 s, top 10.
    pub fn new(seed: u64) -> Self {
        DemoSettings {
            seed,
            rate: None,
            total_records: None,
            write_ahead_log: true,
            window: Duration::from_secs(30),
            slide: Duration::from_secs(2),
            top_n: 10,
            on_top_words: None,
            output_dir: None,
            on_window_counts: None,
        }
    }
}

/// The demo's batch interval.
pub const DEMO_BATCH_INTERVAL: Duration = Duration::from_secs(1);

/// One batch's record in the exactly-once output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchCounts {
    /// The batch.
    pub batch_id: BatchId,
    /// Its time.
    pub batch_time: Time,
    /// Words in the batch.
    pub records: u64,
    /// Count of each word in the batch.
    pub counts: BTreeMap<String, u64>,
}

/// Declares the demo pipeline on `p`.
pub fn word_count_pipeline(p: &mut PipelineBuilder, options: &DemoSettings) -> Result<(), RuntimeError> {
    if let Some(dir) = &options.output_dir {
        create_private_dir(dir).map_err(|e| RuntimeError::io("create", dir, e))?;
    }
    let receiver_options = ReceiverSettings {
        write_ahead_log: options.write_ahead_log,
        max_block_records: Some(256 * 1024),
        ..ReceiverSettings::default()
    };
    let mut generator = GeneratorSettings::new(options.seed);
    generator.records_per_sec = options.rate;
    generator.total_records = options.total_records;
    // Large hand-overs to the block generator (fewer round trips per word);
    // at a set rate no more than about 10 ms of words, so the flow stays smooth.
    generator.batch_size = options.rate.map_or(16 * 1024, |rate| (rate / 100).clamp(1024, 16 * 1024) as usize);
    let words = p.receiver_stream("words", receiver_options, move |resume| {
        GeneratorReceiver::resuming_at(generator, resume.records_stored)
    });
    // Counted once per batch, each block into its few distinct words first,
    // read in place as it arrives (no `String` per word, no `(word, 1)` copy
    // of the batch); the window sums the per-batch counts (the same result,
    // since the sum is associative), so it handles a few keys per batch
    // instead of every word.
    let per_batch = words.map_partitions_in_place(count_words).reduce_by_key(|a, b| a + b).name("batch-counts");
    let output_dir = options.output_dir.clone();
    per_batch
        .foreach_batch(move |batch, info| {
            let counts: BTreeMap<String, u64> = batch.iter().map(|(word, n)| (word.to_string(), *n)).collect();
            let record =
                BatchCounts { batch_id: info.batch_id, batch_time: info.time, records: counts.values().sum(), counts };
            match &output_dir {
                Some(dir) => write_once(&dir.join(format!("batch-{:010}.json", info.batch_id.0)), &record),
                None => Ok(()),
            }
        })
        .name("batch-counts-out");
    let windowed = per_batch
        .reduce_by_key_and_window_inv_filtered(
            |a, b| a + b,
            |a, b| a.saturating_sub(*b),
            options.window,
            options.slide,
            |_, count| *count > 0,
        )
        .name("window-counts");
    let (top_n, callback, output_dir) = (options.top_n, options.on_top_words.clone(), options.output_dir.clone());
    let on_counts = options.on_window_counts.clone();
    windowed
        .foreach_batch(move |batch, info| {
            let mut words: Vec<(String, u64)> = batch.iter().cloned().collect();
            if let Some(on_counts) = &on_counts {
                on_counts(&words, info)?;
            }
            words.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            words.truncate(top_n);
            let top = TopWords { batch_id: info.batch_id, batch_time: info.time, words };
            if let Some(callback) = &callback {
                callback(&top);
            }
            match &output_dir {
                Some(dir) => write_once(&dir.join(format!("window-{:010}.json", info.batch_id.0)), &top),
                None => Ok(()),
            }
        })
        .name("top-words");
    Ok(())
}

/// Counts the words of one partition: one hash-map probe per word, and a
/// copy of a word only the first time the partition has it.
fn count_words(words: Views<'_, String>) -> Vec<(String, u64)> {
    let mut counts: KeyHashMap<String, u64> = KeyHashMap::default();
    for word in words {
        match counts.get_mut(word) {
            Some(count) => *count += 1,
            None => {
                counts.insert(word.to_owned(), 1);
            }
        }
    }
    counts.into_iter().collect()
}

/// A context running the demo: with a checkpoint directory it recovers
/// (and resumes the generator where its stored words end).
pub fn word_count_context(
    checkpoint_dir: Option<&Path>,
    settings: StreamingSettings,
    options: &DemoSettings,
) -> Result<StreamingContext, RuntimeError> {
    let build = |p: &mut PipelineBuilder| word_count_pipeline(p, options).map_err(Into::into);
    match checkpoint_dir {
        Some(dir) => StreamingContext::get_or_create(dir, settings, build),
        None => StreamingContext::new(settings, build),
    }
}

/// Demo settings: 1 s batches.
pub fn demo_settings() -> StreamingSettings {
    StreamingSettings::new(DEMO_BATCH_INTERVAL)
}

/// Writes `value` as JSON to `path` unless it exists: a re-run batch finds
/// its file and leaves it (the same batch id has the same content).
fn write_once<T: Serialize>(path: &Path, value: &T) -> Result<(), spate_dstream::BoxError> {
    if path.exists() {
        return Ok(());
    }
    let tmp = path.with_extension("json.tmp");
    // What a crash left is replaced, so the file made here has our mode.
    if let Err(e) = fs::remove_file(&tmp)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(e.into());
    }
    let mut file = create_private_file(&tmp)?;
    file.write_all(&serde_json::to_vec(value)?)?;
    file.sync_all()?;
    drop(file);
    match fs::hard_link(&tmp, path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    fs::remove_file(&tmp)?;
    if let Some(parent) = path.parent() {
        fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Creates `dir` and its missing parents, owner-only (0700).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Creates the new file `path`, owner-only (0600).
fn create_private_file(path: &Path) -> std::io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// What [`verify_output`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputCheck {
    /// Batches with an output file.
    pub batches: u64,
    /// Words over all batches.
    pub records: u64,
}

/// Checks the exactly-once output in `dir` against the generator of `seed`:
/// batch files numbered 0..n without gaps, whose word counts add up to
/// exactly the counts of the first `records` words of the sequence (a lost
/// or repeated record changes them).
pub fn verify_output(dir: &Path, seed: u64) -> Result<OutputCheck, String> {
    let mut batches: Vec<u64> = fs::read_dir(dir)
        .map_err(|e| format!("list {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|name| name.strip_prefix("batch-")?.strip_suffix(".json")?.parse().ok())
        .collect();
    batches.sort_unstable();
    if let Some((i, b)) = batches.iter().enumerate().find(|(i, b)| **b != *i as u64) {
        return Err(format!("batch output {i} is missing (next present: {b})"));
    }
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    let mut records = 0;
    for batch in &batches {
        let path = dir.join(format!("batch-{batch:010}.json"));
        let bytes = fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let counts: BatchCounts = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        records += counts.records;
        for (word, n) in counts.counts {
            *totals.entry(word).or_default() += n;
        }
    }
    let generator = WordGenerator::new(seed);
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..records {
        *expected.entry(generator.word_at(i).to_string()).or_default() += 1;
    }
    if totals != expected {
        let differing: Vec<String> = expected
            .keys()
            .chain(totals.keys())
            .filter(|w| expected.get(*w) != totals.get(*w))
            .take(5)
            .map(|w| format!("{w}: expected {:?}, got {:?}", expected.get(w), totals.get(w)))
            .collect();
        return Err(format!("word counts over {records} words differ from the seed's: {}", differing.join("; ")));
    }
    Ok(OutputCheck { batches: batches.len() as u64, records })
}
