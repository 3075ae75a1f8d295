//! A fast, non-cryptographic hasher for shuffles and per-key maps.
//!
//! Keys in a stream come from the pipeline's own data, and SipHash (std's
//! default, built to resist flooding by untrusted keys) costs several times
//! more per key than this multiply-rotate hash in the inner loops of
//! `reduce_by_key` and the windows. The partitioner mixes the hash once more
//! so that the bits choosing a partition are not the bits the maps use.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// The multiplier of the FxHash family (an odd constant with well spread bits).
const SEED: u64 = 0xf135_7aea_2e62_a9c5;

/// A word-at-a-time multiply hasher in the style of rustc's FxHasher.
#[derive(Clone, Copy, Debug, Default)]
pub struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = self.hash.wrapping_add(word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // The product's best-mixed bits are the high ones; hash maps index
        // with the low ones, so rotate the high bits down.
        self.hash.rotate_left(26)
    }
}

/// Builds [`FxHasher`]s.
pub type FxBuildHasher = BuildHasherDefault<FxHasher>;

/// A `HashMap` keyed through [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, FxBuildHasher>;

/// The [`FxHasher`] hash of `key`.
#[inline]
pub fn fx_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut hasher = FxHasher::default();
    key.hash(&mut hasher);
    hasher.finish()
}

/// The partition (in `0..partitions`) that `key` belongs to under hash
/// partitioning. Stable across runs and machines for the same key bytes.
#[inline]
pub fn partition_of<K: Hash + ?Sized>(key: &K, partitions: usize) -> usize {
    if partitions <= 1 {
        return 0;
    }
    // Mix again so the partition does not correlate with the bits a map
    // uses inside one partition, then map to the range by multiply-shift.
    let mixed = fx_hash(key).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32;
    ((mixed * partitions as u64) >> 32) as usize
}

/// An empty [`FxHashMap`] with room for `capacity` entries.
pub(crate) fn map_with_capacity<K, V>(capacity: usize) -> FxHashMap<K, V> {
    FxHashMap::with_capacity_and_hasher(capacity, FxBuildHasher::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_hash_equal_and_partitions_are_in_range() {
        assert_eq!(fx_hash("spate"), fx_hash(&"spate".to_string()));
        assert_ne!(fx_hash("spate"), fx_hash("spata"));
        for n in 1..9 {
            for key in 0..1000u64 {
                assert!(partition_of(&key, n) < n);
            }
        }
    }

    #[test]
    fn partitions_are_balanced() {
        let mut counts = [0usize; 4];
        for key in 0..40_000u64 {
            counts[partition_of(&format!("word{key}"), 4)] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
    }
}
