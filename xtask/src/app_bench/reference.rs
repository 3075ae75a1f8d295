//! The backlog's lines, drawn the same every run, and the reference: each
//! word's count per window of what was produced, which a run's output is
//! checked against.

use std::collections::BTreeMap;

use super::{OUT_OF_ORDERNESS_MS, VOCABULARY, WINDOW_MS, WORDS_PER_LINE};

/// splitmix64: the same lines every run.
pub(super) struct Draws(pub(super) u64);

impl Draws {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The vocabulary: pronounceable words of 2 to 4 syllables.
pub(super) fn vocabulary() -> Vec<String> {
    const SYLLABLES: [&str; 16] =
        ["ka", "lo", "mi", "ner", "po", "su", "ta", "vel", "da", "rin", "go", "he", "ju", "bo", "fa", "zu"];
    let mut draws = Draws(7);
    let mut words: Vec<String> = Vec::new();
    while words.len() < VOCABULARY {
        let n = 2 + draws.next() % 3;
        let word: String = (0..n).map(|_| SYLLABLES[(draws.next() % 16) as usize]).collect();
        if !words.contains(&word) {
            words.push(word);
        }
    }
    words
}

/// One line of words, some far more frequent than others (the index is
/// the square of a uniform draw).
pub(super) fn line(words: &[String], draws: &mut Draws) -> String {
    let mut text = String::new();
    for i in 0..WORDS_PER_LINE {
        let u = (draws.next() >> 11) as f64 / (1u64 << 53) as f64;
        if i > 0 {
            text.push(' ');
        }
        text.push_str(&words[((u * u) * words.len() as f64) as usize]);
    }
    text
}

/// Each word's count per window of what was produced, and the latest time
/// of each input partition.
#[derive(Default)]
pub(super) struct Reference {
    counts: BTreeMap<(String, i64), u64>,
    latest: BTreeMap<i32, i64>,
}

impl Reference {
    pub(super) fn add(&mut self, partition: i32, ts: i64, line: &str) {
        let size: i64 = WINDOW_MS.parse().unwrap();
        for word in line.split_whitespace() {
            *self.counts.entry((word.to_string(), ts.div_euclid(size) * size)).or_default() += 1;
        }
        let latest = self.latest.entry(partition).or_insert(ts);
        *latest = (*latest).max(ts);
    }

    /// Checks the counts `output` holds against the windows the watermark
    /// closed: those ending by the earliest of the partitions' latest times
    /// less the bound on out-of-orderness (every split task idle once its
    /// backlog is done holds the watermark at what it sent last).
    pub(super) fn check(&self, output: &BTreeMap<(String, i64), (u64, u64)>, late_words: u64) -> Windows {
        let size: i64 = WINDOW_MS.parse().unwrap();
        let slowest = self.latest.values().min().copied().unwrap_or(i64::MIN);
        let watermark = slowest.saturating_sub(OUT_OF_ORDERNESS_MS.parse::<i64>().unwrap());
        let closed: Vec<_> = self.counts.iter().filter(|((_, start), _)| start + size <= watermark).collect();
        let exact = closed.iter().filter(|(key, count)| output.get(*key).map(|(c, _)| c) == Some(*count)).count();
        let revised = output.values().filter(|(_, revision)| *revision > 0).count();
        Windows { closed: closed.len(), exact, revised, late_words }
    }
}

/// A run's windows against the reference.
#[derive(Debug)]
pub(super) struct Windows {
    /// Windows the watermark closed, by the reference.
    pub(super) closed: usize,
    /// Of those, the ones whose last count equals the reference's.
    pub(super) exact: usize,
    /// Windows written again after late words changed them.
    pub(super) revised: usize,
    /// Words the count stage set aside as late.
    pub(super) late_words: u64,
}
