//! Compact keyed state: each key kept once, and per-batch data as arrays
//! against it.
//!
//! A keyed window over a million keys keeps, besides its result per key,
//! one slice per retained batch. Kept as maps of `(K, V)` those slices hold
//! each key again in every batch it occurs in: 30 slices of a 30 s window
//! over 1 s batches store a word up to 30 times, and the allocator's
//! overhead with it. Here a partition's keys live in one [`KeyTable`],
//! which names each by a dense id, and a slice is an [`EncodedSlice`]: its
//! ids in ascending order as varint gaps, each followed by its value in the
//! state codec's encoding. A slice of 600,000 small counts then takes about
//! 2 bytes an entry instead of some 60.
//!
//! Ids are per table, not stable across runs: a snapshot writes keys with
//! their ids, and a restore on another partition count re-keys by value.

use hashbrown::HashTable;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use spate_core::CoreError;
use std::hash::BuildHasher;

use crate::batch::Key;
use crate::hash::KeyHashState;

/// The keys of one partition, each stored once and named by a dense id.
/// Ids of removed keys are reused.
pub(crate) struct KeyTable<K> {
    /// By id; `None` for a free id.
    keys: Vec<Option<K>>,
    /// Ids, found by their key's hash.
    index: HashTable<u32>,
    hasher: KeyHashState,
    free: Vec<u32>,
}

impl<K> Default for KeyTable<K> {
    fn default() -> Self {
        KeyTable { keys: Vec::new(), index: HashTable::new(), hasher: KeyHashState::default(), free: Vec::new() }
    }
}

impl<K: Key> KeyTable<K> {
    /// The number of keys.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// One more than the highest id ever given: the length arrays indexed
    /// by id need.
    pub(crate) fn id_bound(&self) -> usize {
        self.keys.len()
    }

    /// The id of `key`, if it has one.
    pub(crate) fn get(&self, key: &K) -> Option<u32> {
        let keys = &self.keys;
        let hash = self.hasher.hash_one(key);
        self.index.find(hash, |id| key_at(keys, *id) == Some(key)).copied()
    }

    /// The id of `key`, giving it one if it has none.
    pub(crate) fn insert(&mut self, key: K) -> u32 {
        let hash = self.hasher.hash_one(&key);
        let (keys, hasher) = (&self.keys, &self.hasher);
        if let Some(id) = self.index.find(hash, |id| key_at(keys, *id) == Some(&key)) {
            return *id;
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => u32::try_from(self.keys.len()).unwrap_or(u32::MAX),
        };
        self.index.insert_unique(hash, id, |id| rehash(hasher, keys, *id));
        self.place(id, key);
        id
    }

    /// The key of `id`.
    pub(crate) fn key(&self, id: u32) -> Option<&K> {
        key_at(&self.keys, id)
    }

    /// Removes the key of `id`, freeing the id.
    pub(crate) fn remove(&mut self, id: u32) -> Option<K> {
        let key = self.keys.get_mut(id as usize)?.take()?;
        let hash = self.hasher.hash_one(&key);
        if let Ok(entry) = self.index.find_entry(hash, |found| *found == id) {
            entry.remove();
        }
        self.free.push(id);
        Some(key)
    }

    /// Every key with its id, in id order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &K)> {
        self.keys.iter().enumerate().filter_map(|(id, key)| Some((u32::try_from(id).ok()?, key.as_ref()?)))
    }

    /// Puts `key` at `id` (as a snapshot recorded it), replacing what was
    /// there. Call [`KeyTable::rebuild_free`] once all are placed.
    pub(crate) fn insert_at(&mut self, id: u32, key: K) -> Result<(), CoreError> {
        if self.get(&key).is_some_and(|existing| existing != id) {
            return Err(CoreError::Decode { reason: format!("key table: a key recorded under two ids (one is {id})") });
        }
        self.remove(id);
        let hash = self.hasher.hash_one(&key);
        let (keys, hasher) = (&self.keys, &self.hasher);
        self.index.insert_unique(hash, id, |id| rehash(hasher, keys, *id));
        self.place(id, key);
        Ok(())
    }

    /// Recomputes the free ids after keys were placed by id.
    pub(crate) fn rebuild_free(&mut self) {
        self.free = (0..self.keys.len())
            .rev()
            .filter(|id| self.keys.get(*id).is_some_and(Option::is_none))
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
    }

    fn place(&mut self, id: u32, key: K) {
        let index = id as usize;
        if self.keys.len() <= index {
            self.keys.resize_with(index + 1, || None);
        }
        if let Some(slot) = self.keys.get_mut(index) {
            *slot = Some(key);
        }
    }
}

/// The hash of the key of `id`, as the index needs it when it grows.
fn rehash<K: Key>(hasher: &KeyHashState, keys: &[Option<K>], id: u32) -> u64 {
    key_at(keys, id).map_or(0, |key| hasher.hash_one(key))
}

fn key_at<K>(keys: &[Option<K>], id: u32) -> Option<&K> {
    keys.get(id as usize).and_then(Option::as_ref)
}

/// Entries `(id, value)` of one batch, encoded: ids ascending as varint
/// gaps, each followed by its value in the state codec's encoding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EncodedSlice {
    bytes: Vec<u8>,
    entries: u32,
}

impl EncodedSlice {
    /// Encodes `entries`, sorting them by id first.
    pub(crate) fn encode<V: Serialize>(entries: &mut [(u32, V)]) -> Result<Self, CoreError> {
        entries.sort_unstable_by_key(|(id, _)| *id);
        let mut bytes = Vec::with_capacity(entries.len() * 3);
        let mut previous = 0u32;
        for (id, value) in entries.iter() {
            push_varint(&mut bytes, id - previous);
            previous = *id;
            bincode::serde::encode_into_std_write(value, &mut bytes, bincode::config::standard())
                .map_err(|e| CoreError::Encode { reason: format!("a window slice's value: {e}") })?;
        }
        bytes.shrink_to_fit();
        let entries = u32::try_from(entries.len()).unwrap_or(u32::MAX);
        Ok(EncodedSlice { bytes, entries })
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries as usize
    }

    /// The bytes the slice takes.
    #[cfg(test)]
    pub(crate) fn encoded_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Calls `each` with every entry, in id order.
    pub(crate) fn for_each<V: DeserializeOwned>(&self, mut each: impl FnMut(u32, V)) -> Result<(), CoreError> {
        let (mut at, mut id) = (0usize, 0u32);
        for _ in 0..self.entries {
            let (gap, used) = read_varint(self.bytes.get(at..).unwrap_or_default())?;
            at += used;
            id = id.checked_add(gap).ok_or_else(|| corrupt("an id past u32"))?;
            let rest = self.bytes.get(at..).unwrap_or_default();
            let (value, used): (V, usize) = bincode::serde::decode_from_slice(rest, bincode::config::standard())
                .map_err(|e| corrupt(&format!("a value: {e}")))?;
            at += used;
            each(id, value);
        }
        if at != self.bytes.len() {
            return Err(corrupt("bytes after the last entry"));
        }
        Ok(())
    }

    /// The entries, decoded.
    #[cfg(test)]
    pub(crate) fn decode<V: DeserializeOwned>(&self) -> Result<Vec<(u32, V)>, CoreError> {
        let mut out = Vec::with_capacity(self.len());
        self.for_each(|id, value| out.push((id, value)))?;
        Ok(out)
    }
}

fn corrupt(what: &str) -> CoreError {
    CoreError::Decode { reason: format!("a window slice: {what}") }
}

fn push_varint(out: &mut Vec<u8>, mut value: u32) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn read_varint(bytes: &[u8]) -> Result<(u32, usize), CoreError> {
    let mut value = 0u32;
    for (index, byte) in bytes.iter().take(5).enumerate() {
        value |= u32::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Ok((value, index + 1));
        }
    }
    Err(corrupt("a truncated id"))
}

/// Written as one byte string (a length and the bytes), not byte by byte.
impl Serialize for EncodedSlice {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (self.entries, ByteString(&self.bytes)).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for EncodedSlice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (entries, OwnedByteString(bytes)) = <(u32, OwnedByteString)>::deserialize(deserializer)?;
        Ok(EncodedSlice { bytes, entries })
    }
}

struct ByteString<'a>(&'a [u8]);

impl Serialize for ByteString<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

struct OwnedByteString(Vec<u8>);

impl<'de> Deserialize<'de> for OwnedByteString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = OwnedByteString;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
                Ok(OwnedByteString(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
                Ok(OwnedByteString(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
                while let Some(byte) = seq.next_element()? {
                    out.push(byte);
                }
                Ok(OwnedByteString(out))
            }
        }
        deserializer.deserialize_byte_buf(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_keeps_its_id_and_a_removed_keys_id_is_reused() {
        let mut table = KeyTable::default();
        let (a, b) = (table.insert("a".to_string()), table.insert("b".to_string()));
        assert_eq!((a, b), (0, 1));
        assert_eq!(table.insert("a".to_string()), a);
        assert_eq!(table.get(&"b".to_string()), Some(b));
        assert_eq!(table.remove(a).as_deref(), Some("a"));
        assert_eq!(table.get(&"a".to_string()), None);
        assert_eq!(table.insert("c".to_string()), a, "the freed id is given again");
        assert_eq!((table.len(), table.id_bound()), (2, 2));
        let listed: Vec<(u32, &str)> = table.iter().map(|(id, k)| (id, k.as_str())).collect();
        assert_eq!(listed, [(0, "c"), (1, "b")]);
    }

    #[test]
    fn keys_placed_by_id_are_found_and_the_gaps_are_free() {
        let mut table = KeyTable::default();
        table.insert_at(3, 30u64).unwrap();
        table.insert_at(1, 10u64).unwrap();
        table.rebuild_free();
        assert_eq!((table.get(&30), table.get(&10), table.key(3)), (Some(3), Some(1), Some(&30)));
        let mut given: Vec<u32> = (0..3).map(|k| table.insert(100 + k)).collect();
        given.sort_unstable();
        assert_eq!(given, [0, 2, 4]);
        assert!(table.insert_at(0, 30).is_err(), "a key under two ids is refused");
        // Past many growths of the index every key is still found.
        let mut many = KeyTable::default();
        let ids: Vec<u32> = (0..10_000u64).map(|k| many.insert(k)).collect();
        assert!((0..10_000u64).all(|k| many.get(&k) == ids.get(k as usize).copied()));
    }

    #[test]
    fn a_slice_round_trips_in_id_order_and_is_small() {
        let mut entries: Vec<(u32, u64)> = (0..10_000u32).rev().map(|id| (id * 2, u64::from(id % 7))).collect();
        let slice = EncodedSlice::encode(&mut entries).unwrap();
        assert_eq!(slice.len(), 10_000);
        assert!(slice.encoded_bytes() <= 2 * 10_000, "{} bytes", slice.encoded_bytes());
        let decoded: Vec<(u32, u64)> = slice.decode().unwrap();
        let expected: Vec<(u32, u64)> = (0..10_000u32).map(|id| (id * 2, u64::from(id % 7))).collect();
        assert_eq!(decoded, expected);
        let bytes = bincode::serde::encode_to_vec(&slice, bincode::config::standard()).unwrap();
        let (back, _): (EncodedSlice, usize) =
            bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        assert_eq!(back, slice);
    }

    #[test]
    fn a_damaged_slice_is_an_error() {
        let slice = EncodedSlice::encode(&mut [(5u32, 300u64), (9, 1)]).unwrap();
        let mut cut = slice.clone();
        cut.bytes.pop();
        assert!(cut.decode::<u64>().is_err());
        let mut longer = slice;
        longer.bytes.push(0);
        assert!(longer.decode::<u64>().is_err());
    }
}
