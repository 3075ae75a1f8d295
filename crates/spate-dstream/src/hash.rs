//! The two hashes of keys: a fixed one that places keys in partitions, and
//! a seeded one inside the per-key maps.
//!
//! [`partition_of`] routes a key to its partition (and to a repartition
//! topic's Kafka partition), so its hash, [`FxHasher`], is fixed: the same
//! key bytes go to the same partition in every run, on every machine. It
//! is a multiply-rotate hash, and the partitioner mixes it once more so
//! that the bits choosing a partition are not the bits a map uses.
//!
//! The maps of `reduce_by_key`, the windows and the keyed state
//! ([`KeyHashMap`]) hash with foldhash under a seed drawn at random for the
//! process (and varied per map). Their keys come from records anyone who
//! can produce to a topic writes, and a fixed-seed multiply hash lets such a
//! producer build keys that all collide (under FxHasher, whatever state it
//! starts from, the words `(a, b)` and `(a', b + (a - a')K)` end alike),
//! which turns every map operation into a scan. foldhash costs about what
//! FxHasher does, where SipHash (std's default) costs several times more in
//! these inner loops. Nothing persists a map's order: a state snapshot is
//! read back into maps by key.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

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
            self.add(tail_word(rest) ^ ((rest.len() as u64) << 59));
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

/// The 1 to 7 bytes of `rest` as a little-endian word padded with zeros,
/// loaded in at most three fixed-size pieces. The same value as copying
/// them into a zeroed `[u8; 8]`, without the variable-length copy (a
/// `memmove` call, a tenth of the cost of counting short words).
#[inline]
fn tail_word(rest: &[u8]) -> u64 {
    let mut word = 0u64;
    let mut at = 0;
    if let Some(four) = rest.first_chunk::<4>() {
        word = u64::from(u32::from_le_bytes(*four));
        at = 4;
    }
    if let Some(two) = rest.get(at..).and_then(|r| r.first_chunk::<2>()) {
        word |= u64::from(u16::from_le_bytes(*two)) << (8 * at);
        at += 2;
    }
    if let Some(&one) = rest.get(at) {
        word |= u64::from(one) << (8 * at);
    }
    word
}

/// Builds the hashers of the per-key maps: foldhash, seeded at random (see
/// the module doc). Each `default()` is seeded apart.
pub type KeyHashState = foldhash::fast::RandomState;

/// A `HashMap` of keys from the stream, hashed through [`KeyHashState`].
pub type KeyHashMap<K, V> = HashMap<K, V, KeyHashState>;

/// The [`FxHasher`] hash of `key`: fixed, for placing keys (see [`partition_of`]).
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

/// `items` split into `partitions` lists by the partition of each one's
/// key ([`partition_of`]), each list in the items' order.
pub(crate) fn split_by_key<T, K: Hash + ?Sized>(
    items: impl IntoIterator<Item = T>,
    partitions: usize,
    key: impl Fn(&T) -> &K,
) -> Vec<Vec<T>> {
    let items = items.into_iter();
    let share = items.size_hint().0 / partitions.max(1) + 1;
    let mut split: Vec<Vec<T>> = (0..partitions).map(|_| Vec::with_capacity(share)).collect();
    for item in items {
        if let Some(target) = split.get_mut(partition_of(key(&item), partitions)) {
            target.push(item);
        }
    }
    split
}

/// An empty [`KeyHashMap`] with room for `capacity` entries.
pub(crate) fn map_with_capacity<K, V>(capacity: usize) -> KeyHashMap<K, V> {
    KeyHashMap::with_capacity_and_hasher(capacity, KeyHashState::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

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
    fn hashes_stay_what_they_were_since_partitions_and_topics_depend_on_them() {
        // Keys were placed in partitions (and a repartition topic's Kafka
        // partitions) by these values; every tail length is covered.
        let pinned: [(&str, u64); 19] = [
            ("", 0x10d1_1c6c_ed11_15bd),
            ("s", 0x5063_078b_d868_7a12),
            ("sp", 0x4959_d34b_d910_0933),
            ("spa", 0x7a85_b74b_dbe0_912f),
            ("spat", 0x5fd5_b74b_d8f5_00c1),
            ("spate", 0xd3d5_b74b_db87_cd06),
            ("spate-", 0xd3d5_b74b_d8f8_ac9a),
            ("spate-s", 0xd3d5_b74b_db37_989a),
            ("spate-st", 0xd3d5_b74b_daa7_989a),
            ("spate-str", 0xc80c_101d_1395_195d),
            ("spate-stre", 0x3ad8_5591_1168_7cb9),
            ("spate-strea", 0x6c04_3991_1039_04b5),
            ("spate-stream", 0xe498_3991_105b_64b7),
            ("spate-stream-", 0x7898_3991_1271_b597),
            ("spate-stream-k", 0x7898_3991_1246_a163),
            ("spate-stream-ka", 0x7898_3991_1292_8563),
            ("spate-stream-kaf", 0x7898_3991_108a_8563),
            ("spate-stream-kafk", 0x8639_e1ec_6fa8_19e3),
            ("spate-stream-kafka", 0x826b_0dd0_6eff_ca6b),
        ];
        for (key, hash) in pinned {
            assert_eq!(fx_hash(key), hash, "{key:?}");
        }
    }

    #[test]
    fn a_tail_reads_as_its_bytes_padded_with_zeros() {
        let bytes = [1u8, 2, 3, 4, 5, 6, 7];
        for len in 1..=7 {
            let mut padded = [0u8; 8];
            padded[..len].copy_from_slice(&bytes[..len]);
            assert_eq!(tail_word(&bytes[..len]), u64::from_le_bytes(padded), "{len} bytes");
        }
    }

    /// `n` keys of 16 bytes that all end in one [`FxHasher`] state, whatever
    /// it started from: with `K` the multiplier, the words `(a, b)` and
    /// `(a', b + (a - a') * K)` leave the same state. Anyone producing to a
    /// topic can write such keys.
    fn colliding_keys(n: u64) -> Vec<Vec<u8>> {
        (0..n)
            .map(|a| {
                let b = 0x5eed_u64.wrapping_sub(a.wrapping_mul(SEED));
                [a.to_le_bytes(), b.to_le_bytes()].concat()
            })
            .collect()
    }

    #[test]
    fn keys_built_to_collide_under_the_partitioning_hash_spread_in_the_maps() {
        let keys = colliding_keys(1000);
        assert!(keys.iter().all(|k| fx_hash(k) == fx_hash(&keys[0])), "the keys collide under the fixed hash");
        let map = map_with_capacity::<Vec<u8>, ()>(0);
        let hashes: std::collections::HashSet<u64> = keys.iter().map(|k| map.hasher().hash_one(k)).collect();
        assert!(hashes.len() > 990, "{} distinct hashes of 1000 keys in a map", hashes.len());
    }

    #[test]
    fn the_maps_hashes_are_seeded_at_random() {
        let (one, other) = (map_with_capacity::<&str, ()>(0), map_with_capacity::<&str, ()>(0));
        let differ =
            ["spate", "stream", "kafka"].iter().filter(|k| one.hasher().hash_one(k) != other.hasher().hash_one(k));
        assert_eq!(differ.count(), 3, "two maps hash alike: their seed is fixed");
    }

    #[test]
    fn a_split_puts_each_item_in_its_keys_partition_in_order() {
        let items: Vec<(String, usize)> = (0..200).map(|n| (format!("k{}", n % 37), n)).collect();
        let split = split_by_key(items.clone(), 3, |(key, _)| key);
        assert_eq!(split.len(), 3);
        for (index, list) in split.iter().enumerate() {
            let expected: Vec<_> = items.iter().filter(|(key, _)| partition_of(key, 3) == index).cloned().collect();
            assert_eq!(list, &expected);
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
