//! The demo pipeline: seeded random words from the generator receiver
//! (write-ahead log on) over a vocabulary of a given number of keys, drawn
//! by Zipf's law (10,000 keys and exponent 1 by default, the shape of a
//! natural language's words), counted per batch and over a sliding window
//! (`reduce_by_key_and_window` with an inverse), the top words of each
//! window handed to a callback (and, when asked, all of its counts to
//! another, such as a file sink), and an exactly-once file output keyed by
//! batch id that [`verify_output`] checks against the generator's seed.
//! The output directory records the generator's settings
//! (`generator.json`): a resumed demo with other settings is refused, since
//! its output would no longer be one sequence's.
//! The output is owner-only (0700 directories, 0600 files), as everything
//! under a checkpoint is: it is usually inside one.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use spate_core::{BatchId, Duration, Time};
use spate_dstream::{BatchInfo, BoxError, KeyHashMap, Views};
use spate_receiver::{GeneratorReceiver, GeneratorSettings, WordGenerator};

/// The demo's default number of distinct words: a realistic vocabulary
/// (the words of everyday text run to some thousands), so the window holds
/// thousands of keys rather than a toy handful.
pub const DEFAULT_DEMO_KEYS: u64 = 10_000;

/// The demo's default Zipf exponent: 1, as word frequencies in natural
/// language (the `r`-th most frequent word about `1/r` as frequent as the first).
pub const DEFAULT_DEMO_ZIPF: f64 = 1.0;

/// The most keys the demo's generator takes (uniformly drawn).
pub const MAX_DEMO_KEYS: u64 = spate_receiver::MAX_KEYS;

/// The most keys the demo's generator takes with a Zipf exponent above 0
/// (its table of cumulative weights takes 8 bytes a key).
pub const MAX_DEMO_ZIPF_KEYS: u64 = spate_receiver::MAX_ZIPF_KEYS;

/// Refuses a key count or Zipf exponent the demo's generator cannot take,
/// saying why, before anything is built.
pub fn check_generator_settings(keys: u64, zipf: f64) -> Result<(), String> {
    spate_receiver::check_keys(keys, zipf).map_err(|e| e.to_string())
}

/// The file of the output directory that records the generator's settings.
const GENERATOR_FILE: &str = "generator.json";

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
    /// How many distinct words the generator draws from ([`DEFAULT_DEMO_KEYS`]).
    pub keys: u64,
    /// The Zipf exponent of the draw (0: uniform; [`DEFAULT_DEMO_ZIPF`]).
    pub zipf: f64,
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
            .field("keys", &self.keys)
            .field("zipf", &self.zipf)
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
    /// The demo of `seed`: unlimited words over [`DEFAULT_DEMO_KEYS`] keys by
    /// Zipf's law of [`DEFAULT_DEMO_ZIPF`], WAL on, 30 s window sliding by 2 s, top 10.
    pub fn new(seed: u64) -> Self {
        DemoSettings {
            seed,
            keys: DEFAULT_DEMO_KEYS,
            zipf: DEFAULT_DEMO_ZIPF,
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

/// A batch's record as it is written: the JSON of [`BatchCounts`], read
/// from the batch's own pairs. At a million distinct words a batch holds
/// hundreds of thousands of them, and a copy of each into a map of its own
/// would take tens of megabytes for the moment the file is written.
#[derive(Serialize)]
struct BatchCountsOut<'a> {
    batch_id: BatchId,
    batch_time: Time,
    records: u64,
    counts: SortedCounts<'a>,
}

/// Word counts written as a JSON object, words in order; each word once
/// (the counts of a `reduce_by_key`).
struct SortedCounts<'a>(Vec<&'a (String, u64)>);

impl<'a> SortedCounts<'a> {
    fn of(pairs: impl Iterator<Item = &'a (String, u64)>) -> Self {
        let mut sorted: Vec<&(String, u64)> = pairs.collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        SortedCounts(sorted)
    }
}

impl Serialize for SortedCounts<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(word, count)| (word, count)))
    }
}

/// The order of the top words: the more frequent is the greater, then the
/// word first in alphabetical order.
pub fn more_frequent(a: &(String, u64), b: &(String, u64)) -> std::cmp::Ordering {
    a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0))
}

/// The generator's settings, as the output directory records them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GeneratorRecord {
    /// The seed.
    pub seed: u64,
    /// Distinct words.
    pub keys: u64,
    /// The Zipf exponent (0: uniform).
    pub zipf: f64,
}

impl GeneratorRecord {
    /// The generator settings of a demo.
    fn of(options: &DemoSettings) -> Self {
        GeneratorRecord { seed: options.seed, keys: options.keys, zipf: options.zipf }
    }

    /// The word sequence these settings generate.
    pub fn generator(&self) -> Result<WordGenerator, RuntimeError> {
        WordGenerator::with_keys(self.seed, self.keys, self.zipf)
            .map_err(|e| RuntimeError::InvalidSetting { setting: "demo generator".into(), reason: e.to_string() })
    }
}

/// Records the generator's settings in `dir` on the first run, and refuses
/// a later run with other settings: the output must stay the sequence of one
/// generator for [`verify_output`] (replayed batches are read back from the
/// write-ahead log, so they would not change, but the words after them would).
fn record_generator(dir: &Path, record: &GeneratorRecord) -> Result<(), RuntimeError> {
    if check_recorded_generator(dir, record)? {
        return Ok(());
    }
    let path = dir.join(GENERATOR_FILE);
    write_once(&path, record).map_err(|e| RuntimeError::InvalidSetting {
        setting: "demo generator".into(),
        reason: format!("write {}: {e}", path.display()),
    })
}

/// Whether `dir` records the generator's settings already (and they are
/// `record`'s: other settings are refused). Writes nothing, so it can be
/// asked before the checkpoint's lock is taken.
fn check_recorded_generator(dir: &Path, record: &GeneratorRecord) -> Result<bool, RuntimeError> {
    if !dir.join(GENERATOR_FILE).exists() {
        return Ok(false);
    }
    let recorded = read_generator_record(dir)
        .map_err(|reason| RuntimeError::InvalidSetting { setting: "demo generator".into(), reason })?;
    if recorded != *record {
        return Err(RuntimeError::InvalidSetting {
            setting: "demo generator".into(),
            reason: format!(
                "the output in {} was made with seed {}, {} keys and Zipf exponent {}, and this run asks for \
                 seed {}, {} keys and Zipf exponent {}: resume with the recorded settings, or start with a new \
                 checkpoint and output",
                dir.display(),
                recorded.seed,
                recorded.keys,
                recorded.zipf,
                record.seed,
                record.keys,
                record.zipf
            ),
        });
    }
    Ok(true)
}

/// The generator's settings recorded in the output directory `dir`.
pub fn read_generator_record(dir: &Path) -> Result<GeneratorRecord, String> {
    let path = dir.join(GENERATOR_FILE);
    let bytes = fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Declares the demo pipeline on `p`.
pub fn word_count_pipeline(p: &mut PipelineBuilder, options: &DemoSettings) -> Result<(), RuntimeError> {
    let words_generator = prepare_output(options)?;
    let receiver_options = ReceiverSettings {
        write_ahead_log: options.write_ahead_log,
        max_block_records: Some(256 * 1024),
        ..ReceiverSettings::default()
    };
    let mut generator = GeneratorSettings::new(options.seed);
    generator.generator = words_generator;
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
    // instead of every word (up to its distinct words: all of a block's
    // words when the vocabulary is large).
    let per_batch = words.map_partitions_in_place(count_words).reduce_by_key(|a, b| a + b).name("batch-counts");
    let output_dir = options.output_dir.clone();
    per_batch
        .foreach_batch(move |batch, info| {
            let Some(dir) = &output_dir else { return Ok(()) };
            let records = batch.iter().map(|(_, n)| *n).sum();
            let counts = SortedCounts::of(batch.iter());
            let record = BatchCountsOut { batch_id: info.batch_id, batch_time: info.time, records, counts };
            write_once(&dir.join(format!("batch-{:010}.json", info.batch_id.0)), &record)
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
    if let Some(on_counts) = options.on_window_counts.clone() {
        windowed
            .foreach_batch(move |batch, info| on_counts(&batch.iter().cloned().collect::<Vec<_>>(), info))
            .name("window-counts-out");
    }
    let (callback, output_dir) = (options.on_top_words.clone(), options.output_dir.clone());
    // Read by `top_n` alone (without the window counts' output), the
    // window lists only each partition's top words, not every word.
    windowed
        .top_n(options.top_n, more_frequent)
        .foreach_batch(move |batch, info| {
            let words = batch.iter().cloned().collect();
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

/// The generator `options` ask for, once their output directory exists
/// and records its settings (or recorded the same ones before).
fn prepare_output(options: &DemoSettings) -> Result<WordGenerator, RuntimeError> {
    let record = GeneratorRecord::of(options);
    let generator = record.generator()?;
    if let Some(dir) = &options.output_dir {
        create_private_dir(dir).map_err(|e| RuntimeError::io("create", dir, e))?;
        record_generator(dir, &record)?;
    }
    Ok(generator)
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
    // Checked before the checkpoint is opened, so a refused setting is
    // reported as itself rather than as a pipeline that failed to build;
    // nothing is written until the pipeline is declared, with the
    // checkpoint's lock held (a writer refused by the lock writes nothing).
    let record = GeneratorRecord::of(options);
    // Checks the settings without building the generator's table, which
    // the pipeline builds.
    check_generator_settings(record.keys, record.zipf)
        .map_err(|reason| RuntimeError::InvalidSetting { setting: "demo generator".into(), reason })?;
    if let Some(dir) = &options.output_dir {
        check_recorded_generator(dir, &record)?;
    }
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
    let mut file = std::io::BufWriter::new(create_private_file(&tmp)?);
    serde_json::to_writer(&mut file, value)?;
    let file = file.into_inner().map_err(std::io::IntoInnerError::into_error)?;
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

/// Checks the exactly-once output in `dir` against the generator of `seed`
/// (with the key count and exponent the output records): batch files
/// numbered 0..n without gaps, whose word counts add up to exactly the
/// counts of the first `records` words of the sequence (a lost or repeated
/// record changes them).
pub fn verify_output(dir: &Path, seed: u64) -> Result<OutputCheck, String> {
    let record = read_generator_record(dir)?;
    if record.seed != seed {
        return Err(format!("the output in {} was made with seed {}, not {seed}", dir.display(), record.seed));
    }
    let generator = record.generator().map_err(|e| e.to_string())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seed: u64, keys: u64, zipf: f64, out: &Path) -> DemoSettings {
        DemoSettings { keys, zipf, output_dir: Some(out.to_path_buf()), ..DemoSettings::new(seed) }
    }

    #[test]
    fn a_batch_is_written_as_its_batch_counts_and_the_top_words_are_the_most_frequent() {
        let pairs: Vec<(String, u64)> =
            [("pear", 3), ("fig", 9), ("apple", 3), ("kiwi", 1), ("date", 9)].map(|(w, n)| (w.to_string(), n)).into();
        let counts = BatchCountsOut {
            batch_id: BatchId(4),
            batch_time: Time::from_millis(5000),
            records: 25,
            counts: SortedCounts::of(pairs.iter()),
        };
        let expected = BatchCounts {
            batch_id: BatchId(4),
            batch_time: Time::from_millis(5000),
            records: 25,
            counts: pairs.iter().cloned().collect(),
        };
        assert_eq!(serde_json::to_string(&counts).unwrap(), serde_json::to_string(&expected).unwrap());
        let mut ranked = pairs.clone();
        ranked.sort_by(|a, b| more_frequent(b, a));
        let owned = |words: &[(&str, u64)]| words.iter().map(|(w, n)| (w.to_string(), *n)).collect::<Vec<_>>();
        assert_eq!(ranked, owned(&[("date", 9), ("fig", 9), ("apple", 3), ("pear", 3), ("kiwi", 1)]));
    }

    #[test]
    fn a_resumed_demo_keeps_its_generator_settings() {
        let (checkpoint, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let open = |options: &DemoSettings| word_count_context(Some(checkpoint.path()), demo_settings(), options);
        drop(open(&options(7, 1_000, 0.5, out.path())).unwrap());
        assert_eq!(read_generator_record(out.path()).unwrap(), GeneratorRecord { seed: 7, keys: 1_000, zipf: 0.5 });
        // The same settings resume.
        drop(open(&options(7, 1_000, 0.5, out.path())).unwrap());
        for (seed, keys, zipf) in [(7, 2_000, 0.5), (7, 1_000, 1.0), (8, 1_000, 0.5)] {
            let Err(error) = open(&options(seed, keys, zipf, out.path())) else { panic!("{keys} {zipf} resumed") };
            assert!(matches!(error, RuntimeError::InvalidSetting { .. }), "{error}");
            let message = error.to_string();
            assert!(message.contains("made with seed 7, 1000 keys and Zipf exponent 0.5"), "{message}");
            assert!(message.contains(&format!("asks for seed {seed}, {keys} keys and Zipf exponent {zipf}")));
        }
        assert_eq!(read_generator_record(out.path()).unwrap().keys, 1_000, "the record is left as it was");
    }

    #[test]
    fn settings_the_generator_cannot_take_are_refused_before_anything_is_written() {
        let (checkpoint, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let output = out.path().join("output");
        let Err(error) = word_count_context(Some(checkpoint.path()), demo_settings(), &options(1, 0, 1.0, &output))
        else {
            panic!("0 keys accepted")
        };
        assert!(error.to_string().contains("key count 0 is not between 1"), "{error}");
        assert!(!output.exists());
        assert_eq!(check_generator_settings(5, f64::NAN).unwrap_err(), check_keys_message(5, f64::NAN));
    }

    fn check_keys_message(keys: u64, zipf: f64) -> String {
        spate_receiver::check_keys(keys, zipf).unwrap_err().to_string()
    }

    #[test]
    fn the_output_is_verified_against_its_recorded_generator() {
        let out = tempfile::tempdir().unwrap();
        let record = GeneratorRecord { seed: 3, keys: 50, zipf: 1.0 };
        record_generator(out.path(), &record).unwrap();
        let generator = record.generator().unwrap();
        let mut counts = BTreeMap::new();
        for word in generator.words(0, 500) {
            *counts.entry(word).or_default() += 1;
        }
        let batch = BatchCounts { batch_id: BatchId(0), batch_time: Time::ZERO, records: 500, counts };
        write_once(&out.path().join("batch-0000000000.json"), &batch).unwrap();
        assert_eq!(verify_output(out.path(), 3).unwrap(), OutputCheck { batches: 1, records: 500 });
        assert!(verify_output(out.path(), 4).unwrap_err().contains("made with seed 3, not 4"));
        // The same counts are not the uniform draw's.
        let uniform = tempfile::tempdir().unwrap();
        record_generator(uniform.path(), &GeneratorRecord { zipf: 0.0, ..record }).unwrap();
        fs::copy(out.path().join("batch-0000000000.json"), uniform.path().join("batch-0000000000.json")).unwrap();
        assert!(verify_output(uniform.path(), 3).unwrap_err().contains("differ from the seed's"));
    }
}
