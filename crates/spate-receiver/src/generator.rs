//! The generator receiver: random words from a fixed vocabulary at a given
//! rate, the same sequence for the same seed (for the demo, the benchmarks
//! and end-to-end tests that need to know the exact input).
//!
//! Word `i` of seed `s` is `vocabulary[splitmix64(s + (i + 1) * γ)]`
//! (scaled to the vocabulary), so any stretch of the sequence can be
//! recomputed on its own with [`WordGenerator::words`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::block_generator::BlockWriter;
use crate::error::ReceiverError;
use crate::rate_limiter::RateLimiter;
use crate::storage::StorageLevel;
use crate::supervisor::{Receiver, ReceiverContext};
use async_trait::async_trait;

/// The default vocabulary of the generator.
pub const VOCABULARY: &[&str] = &[
    "spate", "stream", "river", "flood", "water", "rain", "storm", "cloud", "wave", "tide", "delta", "lake", "brook",
    "creek", "torrent", "current", "batch", "block", "window", "state", "offset", "record", "event", "time", "the",
    "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
];

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 output function: a well-mixed 64-bit value of `state`.
pub fn splitmix64(state: u64) -> u64 {
    let mut z = state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The deterministic word sequence of a seed over a vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WordGenerator {
    seed: u64,
    vocabulary: Arc<[String]>,
}

impl WordGenerator {
    /// The sequence of `seed` over [`VOCABULARY`].
    pub fn new(seed: u64) -> Self {
        WordGenerator { seed, vocabulary: VOCABULARY.iter().map(|w| (*w).to_string()).collect() }
    }

    /// The sequence of `seed` over `vocabulary`, which must not be empty.
    pub fn with_vocabulary(seed: u64, vocabulary: Vec<String>) -> Result<Self, ReceiverError> {
        if vocabulary.is_empty() {
            return Err(ReceiverError::InvalidConfig { what: "the generator's vocabulary is empty".into() });
        }
        Ok(WordGenerator { seed, vocabulary: vocabulary.into() })
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The vocabulary words are drawn from.
    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    /// The vocabulary slot of word number `index`.
    fn slot_at(&self, index: u64) -> usize {
        let random = splitmix64(self.seed.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)));
        // Scale to the vocabulary with a multiply rather than a modulo (no bias worth the name).
        ((u128::from(random) * self.vocabulary.len() as u128) >> 64) as usize
    }

    /// Word number `index` (from 0) of the sequence.
    pub fn word_at(&self, index: u64) -> &str {
        self.vocabulary.get(self.slot_at(index)).map_or("", String::as_str)
    }

    /// Writes words `start..start + count` in place into a block: each
    /// word is copied from the vocabulary into the block's bytes, and no
    /// `String` is made.
    pub fn write_in_place(&self, start: u64, count: usize, block: &mut BlockWriter<'_, String>) {
        for index in start..start + count as u64 {
            block.push(self.word_at(index));
        }
    }

    /// Words `start..start + count`: the reference input of tests.
    pub fn words(&self, start: u64, count: usize) -> Vec<String> {
        (start..start + count as u64).map(|index| self.word_at(index).to_owned()).collect()
    }
}

/// How a [`GeneratorReceiver`] produces words.
#[derive(Clone, Debug)]
pub struct GeneratorSettings {
    /// The sequence.
    pub generator: WordGenerator,
    /// Words per second, at most (on the supervisor's clock); `None`: as fast as possible.
    pub records_per_sec: Option<u64>,
    /// Stop after this many words (then flush and finish); `None`: never.
    pub total_records: Option<u64>,
    /// Words handed to the block generator at once.
    pub batch_size: usize,
    /// Flush (and acknowledge) every this many words; `None`: only at the end.
    pub flush_every: Option<u64>,
    /// The level the runtime should store the blocks at.
    pub storage_level: StorageLevel,
}

impl GeneratorSettings {
    /// Unlimited words of `seed` over [`VOCABULARY`], in batches of 1024.
    pub fn new(seed: u64) -> Self {
        GeneratorSettings {
            generator: WordGenerator::new(seed),
            records_per_sec: None,
            total_records: None,
            batch_size: 1024,
            flush_every: None,
            storage_level: StorageLevel::default(),
        }
    }
}

/// How far a [`GeneratorReceiver`] got; shared, so it can be read while it runs.
#[derive(Debug, Default)]
pub struct GeneratorProgress {
    produced: AtomicU64,
    acknowledged: AtomicU64,
}

impl GeneratorProgress {
    /// Words handed to the block generator (the next word's index).
    pub fn produced(&self) -> u64 {
        self.produced.load(Ordering::Acquire)
    }

    /// Words known to be stored (durably, with the WAL on): a restarted
    /// process resumes the sequence here and loses nothing.
    pub fn acknowledged(&self) -> u64 {
        self.acknowledged.load(Ordering::Acquire)
    }
}

/// Produces the words of a [`WordGenerator`] at a rate, as `String`
/// records written in place into their blocks; a reliable receiver: its
/// acknowledged position only moves after a flush returned.
#[derive(Debug)]
pub struct GeneratorReceiver {
    config: GeneratorSettings,
    progress: Arc<GeneratorProgress>,
}

impl GeneratorReceiver {
    /// A receiver starting at word 0.
    pub fn new(config: GeneratorSettings) -> Self {
        Self::resuming_at(config, 0)
    }

    /// A receiver starting at word `start` (an acknowledged position).
    pub fn resuming_at(config: GeneratorSettings, start: u64) -> Self {
        let progress = GeneratorProgress { produced: AtomicU64::new(start), acknowledged: AtomicU64::new(start) };
        GeneratorReceiver { config, progress: Arc::new(progress) }
    }

    /// Its progress, to read while it runs.
    pub fn progress(&self) -> Arc<GeneratorProgress> {
        Arc::clone(&self.progress)
    }

    fn acknowledge(&self, ctx: &ReceiverContext<String>) -> Result<(), ReceiverError> {
        ctx.flush()?;
        self.progress.acknowledged.store(self.progress.produced(), Ordering::Release);
        Ok(())
    }
}

#[async_trait]
impl Receiver<String> for GeneratorReceiver {
    fn name(&self) -> String {
        format!("generator(seed={})", self.config.generator.seed())
    }

    fn storage_level(&self) -> StorageLevel {
        self.config.storage_level
    }

    async fn run(&mut self, ctx: ReceiverContext<String>) -> Result<(), ReceiverError> {
        let limiter = self.config.records_per_sec.map(|rate| RateLimiter::new(ctx.clock(), Some(rate)));
        let batch_size = self.config.batch_size.max(1) as u64;
        let mut unflushed = 0u64;
        loop {
            let produced = self.progress.produced();
            let remaining = self.config.total_records.map_or(u64::MAX, |total| total.saturating_sub(produced));
            if remaining == 0 {
                self.acknowledge(&ctx)?;
                return Ok(());
            }
            let n = batch_size.min(remaining);
            if let Some(until) = limiter.as_ref().and_then(|l| l.reserve(n))
                && !ctx.wait_until(until)
            {
                return Ok(());
            }
            // Words are written straight into the block's bytes: no batch to
            // copy, no `String` per word, nothing to encode when it is cut.
            let mut next = produced;
            ctx.store_in_place_with(n as usize, |block, count| {
                self.config.generator.write_in_place(next, count, block);
                next += count as u64;
            })?;
            self.progress.produced.store(produced + n, Ordering::Release);
            unflushed += n;
            if self.config.flush_every.is_some_and(|every| unflushed >= every) {
                self.acknowledge(&ctx)?;
                unflushed = 0;
            }
            if ctx.is_stopped() {
                return Ok(());
            }
            // Lets the run be cancelled and its other tasks progress.
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_is_deterministic_and_seekable() {
        let a = WordGenerator::new(42);
        let words = a.words(0, 1000);
        assert_eq!(words, WordGenerator::new(42).words(0, 1000));
        assert_eq!(a.words(500, 10), words[500..510].to_vec());
        assert_ne!(words, WordGenerator::new(43).words(0, 1000));
        // Every word of a long run comes from the vocabulary, and most words appear.
        let distinct: std::collections::HashSet<&String> = words.iter().collect();
        assert!(distinct.iter().all(|w| VOCABULARY.contains(&w.as_str())));
        assert!(distinct.len() > VOCABULARY.len() / 2);
    }

    #[test]
    fn empty_vocabulary_is_refused() {
        assert!(WordGenerator::with_vocabulary(1, Vec::new()).is_err());
        let one = WordGenerator::with_vocabulary(1, vec!["only".into()]).unwrap();
        assert_eq!(one.words(0, 3), vec!["only", "only", "only"]);
    }

    #[test]
    fn splitmix_matches_reference_values() {
        // splitmix64 seeded with 0: the first outputs of the reference generator.
        assert_eq!(splitmix64(GAMMA), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(GAMMA.wrapping_mul(2)), 0x6E78_9E6A_A1B9_65F4);
    }
}
