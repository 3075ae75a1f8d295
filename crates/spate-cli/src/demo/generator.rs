//! The demo's word generator: record `i` of seed `s` is always the same word,
//! so a batch is replayed exactly from its logged positions, and two runs
//! with the same seed can be compared record for record.
//!
//! The words are skewed (a few are frequent, most are rare) so the top words
//! of a window are stable enough to watch.

use std::collections::BTreeMap;

/// The words the generator draws from, most frequent first.
const WORDS: [&str; 40] = [
    "stream",
    "batch",
    "offset",
    "commit",
    "window",
    "state",
    "kafka",
    "spate",
    "record",
    "block",
    "receiver",
    "checkpoint",
    "recovery",
    "lock",
    "epoch",
    "partition",
    "topic",
    "sink",
    "source",
    "watermark",
    "replay",
    "exactly",
    "once",
    "durable",
    "fsync",
    "segment",
    "tracker",
    "driver",
    "executor",
    "latency",
    "throughput",
    "backpressure",
    "rate",
    "slide",
    "interval",
    "graph",
    "operator",
    "snapshot",
    "quarantine",
    "repair",
];

/// SplitMix64: a fast, well-mixed 64-bit hash of the record's index.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The word at `position` of the stream generated from `seed`.
pub(crate) fn word_at(seed: u64, position: u64) -> &'static str {
    let h = mix(seed ^ mix(position));
    // Squaring a uniform draw in [0, 1) skews it towards 0: the first words win.
    let u = (h >> 11) as f64 / (1u64 << 53) as f64;
    let index = ((u * u) * WORDS.len() as f64) as usize;
    WORDS[index.min(WORDS.len() - 1)]
}

/// Word counts of the records at positions `start..end`.
pub(crate) fn count_words(seed: u64, start: u64, end: u64) -> BTreeMap<&'static str, u64> {
    let mut counts = BTreeMap::new();
    for position in start..end {
        *counts.entry(word_at(seed, position)).or_insert(0) += 1;
    }
    counts
}

/// The `k` most frequent words, by count then alphabetically.
pub(crate) fn top_words(counts: &BTreeMap<&'static str, u64>, k: usize) -> Vec<(&'static str, u64)> {
    let mut ranked: Vec<(&'static str, u64)> = counts.iter().map(|(w, c)| (*w, *c)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    ranked.truncate(k);
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_words_other_seed_other_words() {
        let a: Vec<_> = (0..200).map(|i| word_at(42, i)).collect();
        let b: Vec<_> = (0..200).map(|i| word_at(42, i)).collect();
        let c: Vec<_> = (0..200).map(|i| word_at(7, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn counts_add_up_and_are_skewed() {
        let counts = count_words(1, 0, 10_000);
        assert_eq!(counts.values().sum::<u64>(), 10_000);
        let top = top_words(&counts, 3);
        assert_eq!(top.len(), 3);
        assert_eq!(top[0].0, "stream");
        assert!(top[0].1 > counts.get("repair").copied().unwrap_or(0) * 3, "{top:?}");
        // Ranges compose: a window is the sum of its batches.
        let (left, right) = (count_words(1, 0, 4_000), count_words(1, 4_000, 10_000));
        for (word, n) in &counts {
            assert_eq!(left.get(word).unwrap_or(&0) + right.get(word).unwrap_or(&0), *n);
        }
    }
}
