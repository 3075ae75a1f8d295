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

use std::marker::PhantomData;

use hashbrown::HashTable;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use spate_core::{CoreError, PayloadReader, varint_len, write_varint};
use std::hash::BuildHasher;

use crate::batch::Key;
use crate::combined::{GROUP, LOOK_AHEAD_FROM};
use crate::hash::KeyHashState;

/// The keys of one partition, each stored once, encoded, and named by a
/// dense id. Ids of removed keys are reused.
///
/// A key is kept as its encoding in the state codec, back to back with the
/// others in one buffer: a million short words take some 16 MB rather than
/// the 56 MB of a million `String`s (a 24-byte handle and a 32-byte heap
/// block each), and none of them is a long-lived allocation scattered
/// among a batch's short-lived ones. Two keys are the same key when their
/// encodings are equal, as with Flink's RocksDB state: true of every key
/// whose `Eq` compares what it serializes (anything with derived `Eq` and
/// `Serialize`).
pub(crate) struct KeyTable<K> {
    /// The encoded keys, each after its length (a varint); a removed key's
    /// bytes stay until a compaction.
    arena: Vec<u8>,
    /// By id: where its key's record starts in `arena` ([`FREE`] for a free id).
    starts: Vec<u32>,
    /// Ids with where their keys start, found by their key's hash: a
    /// lookup reads the arena straight from the index, without the
    /// `starts` array in between (one cache miss fewer a key).
    index: HashTable<Slot>,
    hasher: KeyHashState,
    free: Vec<u32>,
    /// Bytes of `arena` no key uses any more.
    garbage: usize,
    /// Where a key being looked up is encoded.
    scratch: Vec<u8>,
    _keys: PhantomData<fn(K) -> K>,
}

/// An index entry: an id and where its key's record starts.
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: u32,
    start: u32,
}

/// The start of a free id.
const FREE: u32 = u32::MAX;

impl<K> Default for KeyTable<K> {
    fn default() -> Self {
        KeyTable {
            arena: Vec::new(),
            starts: Vec::new(),
            index: HashTable::new(),
            hasher: KeyHashState::default(),
            free: Vec::new(),
            garbage: 0,
            scratch: Vec::new(),
            _keys: PhantomData,
        }
    }
}

/// The most keys [`KeyTable::reserve`] makes room for at once (some
/// 200 MB of index); more grow the table as they come.
const RESERVE_AT_MOST: usize = 1 << 24;

/// A compaction runs when this much of the arena, and at least half of
/// it, is garbage.
const COMPACT_AFTER_BYTES: usize = 1 << 20;

impl<K: Key> KeyTable<K> {
    /// The number of keys.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// One more than the highest id ever given: the length arrays indexed
    /// by id need.
    pub(crate) fn id_bound(&self) -> usize {
        self.starts.len()
    }

    /// The bytes the table takes in memory (its buffers' capacities).
    pub(crate) fn memory_bytes(&self) -> usize {
        let u32s = (self.starts.capacity() + self.free.capacity()) * std::mem::size_of::<u32>();
        // An index bucket is its slot and one control byte.
        let index = self.index.capacity() * (std::mem::size_of::<Slot>() + 1);
        self.arena.capacity() + self.scratch.capacity() + u32s + index
    }

    /// Makes room for `keys` more keys in the index and the ids, so that
    /// placing a snapshot's keys does not rehash the index as it grows (a
    /// tenth of a million-key restore). At most [`RESERVE_AT_MOST`] are
    /// reserved: the count comes from a file.
    pub(crate) fn reserve(&mut self, keys: u64) {
        let keys = usize::try_from(keys).unwrap_or(usize::MAX).min(RESERVE_AT_MOST);
        let (arena, hasher) = (&self.arena, &self.hasher);
        self.index.reserve(keys, |slot| record_at(arena, slot.start).map_or(0, |b| hasher.hash_one(b)));
        self.starts.reserve(keys);
    }

    /// The id of `key`, giving it one if it has none.
    pub(crate) fn insert(&mut self, key: &K) -> Result<u32, CoreError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let id = encode_key(key, &mut scratch).and_then(|()| self.insert_encoded(&scratch));
        self.scratch = scratch;
        id
    }

    /// The ids of `keys`, in order, giving an id to each key that has
    /// none; `given` is called with each id given.
    ///
    /// The same as [`KeyTable::insert`] key by key, but faster on a table
    /// larger than the CPU's caches. A lookup there is a chain of cache
    /// misses (the key's bytes, then its index bucket, then the stored
    /// key to compare), each waiting on the one before. Taken in groups,
    /// each step is done for every key of a group before the next step
    /// starts, so the group's misses of one step are independent and
    /// overlap; the last step then finds the lines it needs in cache.
    ///
    /// It takes the keys by value and drops each right after encoding it,
    /// while its allocation is still in cache: a million keys freed
    /// later, in one go, cost a miss each.
    pub(crate) fn insert_many(
        &mut self,
        keys: impl IntoIterator<Item = K>,
        ids: &mut Vec<u32>,
        mut given: impl FnMut(u32),
    ) -> Result<(), CoreError> {
        let mut keys = keys.into_iter().peekable();
        let mut group = EncodedKeys::default();
        while keys.peek().is_some() {
            group.clear();
            for key in keys.by_ref().take(GROUP) {
                group.push(&key)?;
            }
            self.insert_many_encoded(&group, ids, &mut given)?;
        }
        Ok(())
    }

    /// `entries` with their keys' ids in place of the keys, in order, by
    /// [`KeyTable::insert_many`].
    pub(crate) fn insert_entries<X>(
        &mut self,
        entries: impl IntoIterator<Item = (K, X)>,
        given: impl FnMut(u32),
    ) -> Result<Vec<(u32, X)>, CoreError> {
        let entries = entries.into_iter();
        let len = entries.size_hint().0;
        let (mut ids, mut values) = (Vec::with_capacity(len), Vec::with_capacity(len));
        let keys = entries.map(|(key, value)| {
            values.push(value);
            key
        });
        self.insert_many(keys, &mut ids, given)?;
        Ok(ids.into_iter().zip(values).collect())
    }

    /// [`KeyTable::insert_many`] for keys already encoded.
    pub(crate) fn insert_many_encoded(
        &mut self,
        keys: &EncodedKeys,
        ids: &mut Vec<u32>,
        mut given: impl FnMut(u32),
    ) -> Result<(), CoreError> {
        let mut keys = keys.iter().peekable();
        while keys.peek().is_some() {
            let mut slices: [&[u8]; GROUP] = [&[]; GROUP];
            let mut len = 0;
            for (slot, key) in slices.iter_mut().zip(keys.by_ref().take(GROUP)) {
                *slot = key;
                len += 1;
            }
            self.insert_group(slices.get(..len).unwrap_or_default(), ids, &mut given)?;
        }
        Ok(())
    }

    /// Inserts a group of encoded keys: hashes them all, looks them up
    /// ahead (on a table past the caches), then inserts each.
    fn insert_group(
        &mut self,
        keys: &[&[u8]],
        ids: &mut Vec<u32>,
        given: &mut impl FnMut(u32),
    ) -> Result<(), CoreError> {
        let mut hashes = [0u64; GROUP];
        for (hash, key) in hashes.iter_mut().zip(keys) {
            *hash = self.hasher.hash_one(key);
        }
        if self.len() >= LOOK_AHEAD_FROM {
            self.look_ahead(hashes.get(..keys.len()).unwrap_or_default());
        }
        for (hash, key) in hashes.iter().zip(keys) {
            let known = self.len();
            let id = self.insert_hashed(key, *hash)?;
            if self.len() > known {
                given(id);
            }
            ids.push(id);
        }
        Ok(())
    }

    /// Reads the index buckets and the stored keys the lookups of a group
    /// of `hashes` will compare, each step for the whole group at once
    /// (see [`KeyTable::insert_many`]).
    fn look_ahead(&self, hashes: &[u64]) {
        let mut candidates = [FREE; GROUP];
        for (candidate, hash) in candidates.iter_mut().zip(hashes) {
            // The first bucket whose tag matches: nearly always the key's own.
            if let Some(slot) = self.index.find(*hash, |_| true) {
                *candidate = slot.start;
            }
        }
        let mut sum = 0u8;
        for start in candidates.iter().filter(|start| **start != FREE) {
            sum ^= self.arena.get(*start as usize).copied().unwrap_or_default();
        }
        std::hint::black_box(sum);
    }

    /// The id of the key encoded as `bytes`, giving it one if it has none.
    pub(crate) fn insert_encoded(&mut self, bytes: &[u8]) -> Result<u32, CoreError> {
        let hash = self.hasher.hash_one(bytes);
        self.insert_hashed(bytes, hash)
    }

    /// [`KeyTable::insert_encoded`] with the hash of `bytes` known.
    fn insert_hashed(&mut self, bytes: &[u8], hash: u64) -> Result<u32, CoreError> {
        if let Some(slot) = self.index.find(hash, |slot| record_at(&self.arena, slot.start) == Some(bytes)) {
            return Ok(slot.id);
        }
        let id = match self.free.pop() {
            Some(id) => id,
            None => u32::try_from(self.starts.len()).map_err(|_| too_many("ids"))?,
        };
        self.place(id, bytes, hash)?;
        Ok(id)
    }

    /// The key of `id`, decoded.
    pub(crate) fn key(&self, id: u32) -> Result<Option<K>, CoreError> {
        let Some(bytes) = self.encoded(id) else { return Ok(None) };
        decode_key(bytes).map(Some)
    }

    /// The encoding of the key of `id`.
    pub(crate) fn encoded(&self, id: u32) -> Option<&[u8]> {
        let start = *self.starts.get(id as usize)?;
        if start == FREE { None } else { record_at(&self.arena, start) }
    }

    /// True when `id` names a key.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.starts.get(id as usize).is_some_and(|start| *start != FREE)
    }

    /// Removes the key of `id`, freeing the id.
    pub(crate) fn remove(&mut self, id: u32) -> bool {
        let Some(bytes) = self.encoded(id) else { return false };
        let (hash, record) = (self.hasher.hash_one(bytes), record_len(bytes.len()));
        if let Ok(entry) = self.index.find_entry(hash, |slot| slot.id == id) {
            entry.remove();
        }
        if let Some(start) = self.starts.get_mut(id as usize) {
            *start = FREE;
        }
        self.garbage += record;
        self.free.push(id);
        self.compact_if_due();
        true
    }

    /// Every key's encoding with its id, in id order.
    pub(crate) fn iter_encoded(&self) -> impl Iterator<Item = (u32, &[u8])> {
        (0..self.starts.len()).filter_map(|id| {
            let id = u32::try_from(id).ok()?;
            Some((id, self.encoded(id)?))
        })
    }

    /// Puts the key encoded as `bytes` at `id` (as a snapshot recorded
    /// it), replacing what was there. Call [`KeyTable::rebuild_free`] once
    /// all are placed.
    pub(crate) fn insert_at(&mut self, id: u32, bytes: &[u8]) -> Result<(), CoreError> {
        let hash = self.hasher.hash_one(bytes);
        let elsewhere = self.index.find(hash, |slot| record_at(&self.arena, slot.start) == Some(bytes));
        if elsewhere.is_some_and(|existing| existing.id != id) {
            return Err(CoreError::Decode { reason: format!("key table: a key recorded under two ids (one is {id})") });
        }
        self.remove(id);
        self.place(id, bytes, hash)
    }

    /// Recomputes the free ids after keys were placed by id.
    pub(crate) fn rebuild_free(&mut self) {
        self.free = (0..self.starts.len())
            .rev()
            .filter(|id| self.starts.get(*id).is_some_and(|start| *start == FREE))
            .filter_map(|id| u32::try_from(id).ok())
            .collect();
    }

    fn place(&mut self, id: u32, bytes: &[u8], hash: u64) -> Result<(), CoreError> {
        let start =
            u32::try_from(self.arena.len()).ok().filter(|s| *s != FREE).ok_or_else(|| too_many("bytes of keys"))?;
        let len = u32::try_from(bytes.len()).map_err(|_| too_many("bytes in one key"))?;
        write_varint(u64::from(len), &mut self.arena);
        self.arena.extend_from_slice(bytes);
        let index = id as usize;
        if self.starts.len() <= index {
            self.starts.resize(index + 1, FREE);
        }
        if let Some(slot) = self.starts.get_mut(index) {
            *slot = start;
        }
        let (arena, hasher) = (&self.arena, &self.hasher);
        let rehash = |slot: &Slot| record_at(arena, slot.start).map_or(0, |b| hasher.hash_one(b));
        self.index.insert_unique(hash, Slot { id, start }, rehash);
        Ok(())
    }

    /// Copies the keys still in use to a new arena once most of it is
    /// garbage, and points the index at their new places.
    fn compact_if_due(&mut self) {
        if self.garbage < COMPACT_AFTER_BYTES || self.garbage * 2 < self.arena.len() {
            return;
        }
        let mut arena = Vec::with_capacity(self.arena.len() - self.garbage);
        for start in self.starts.iter_mut().filter(|start| **start != FREE) {
            let bytes = record_at(&self.arena, *start).unwrap_or_default();
            // The new arena is smaller than the old, whose offsets fit in u32.
            *start = arena.len() as u32;
            write_varint(bytes.len() as u64, &mut arena);
            arena.extend_from_slice(bytes);
        }
        for slot in self.index.iter_mut() {
            slot.start = self.starts.get(slot.id as usize).copied().unwrap_or(FREE);
        }
        self.arena = arena;
        self.garbage = 0;
    }
}

/// Keys encoded as a key table encodes them, back to back: keys encoded
/// where they are made (on the thread that processed their block), for a
/// table to take later without reading the keys themselves (see
/// [`KeyTable::insert_many_encoded`]).
#[derive(Debug, Default)]
pub(crate) struct EncodedKeys {
    bytes: Vec<u8>,
    /// Where each key's encoding ends in `bytes`.
    ends: Vec<u32>,
}

impl EncodedKeys {
    /// Appends `key`'s encoding.
    pub(crate) fn push<K: Key>(&mut self, key: &K) -> Result<(), CoreError> {
        encode_key(key, &mut self.bytes)?;
        self.end_key()
    }

    /// Appends every key of `other`, in order.
    pub(crate) fn append(&mut self, other: &EncodedKeys) -> Result<(), CoreError> {
        let offset = u32::try_from(self.bytes.len()).map_err(|_| too_many("bytes of a block's keys"))?;
        let last = other.ends.last().copied().unwrap_or(0);
        offset.checked_add(last).ok_or_else(|| too_many("bytes of a block's keys"))?;
        self.bytes.extend_from_slice(&other.bytes);
        self.ends.extend(other.ends.iter().map(|end| end + offset));
        Ok(())
    }

    /// `Ok` when every key of `other` can be appended to these.
    pub(crate) fn room_for(&self, other: &EncodedKeys) -> Result<(), CoreError> {
        u32::try_from(self.bytes.len() + other.bytes.len()).map_err(|_| too_many("bytes of a block's keys"))?;
        u32::try_from(self.len() + other.len()).map_err(|_| too_many("keys of a block"))?;
        Ok(())
    }

    /// Appends a key already encoded (one of another `EncodedKeys`).
    pub(crate) fn push_encoded(&mut self, key: &[u8]) -> Result<(), CoreError> {
        self.bytes.extend_from_slice(key);
        self.end_key()
    }

    /// Marks the end of the key just written to `bytes`.
    fn end_key(&mut self) -> Result<(), CoreError> {
        self.ends.push(u32::try_from(self.bytes.len()).map_err(|_| too_many("bytes of a block's keys"))?);
        Ok(())
    }

    /// The encoding of the key at `index`, in the order pushed.
    pub(crate) fn get(&self, index: usize) -> Option<&[u8]> {
        let start = index.checked_sub(1).map_or(Some(0), |before| self.ends.get(before).copied())?;
        self.bytes.get(start as usize..*self.ends.get(index)? as usize)
    }

    /// The number of keys.
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Empties it, keeping its buffers.
    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// The bytes it takes in memory.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * std::mem::size_of::<u32>()
    }

    /// Each key's encoding, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(start, end)| self.bytes.get(start as usize..*end as usize).unwrap_or_default())
    }
}

/// Appends `key`'s encoding in the state codec to `out`.
fn encode_key<K: Key>(key: &K, out: &mut Vec<u8>) -> Result<(), CoreError> {
    bincode::serde::encode_into_std_write(key, out, bincode::config::standard())
        .map(|_| ())
        .map_err(|e| CoreError::Encode { reason: format!("a key: {e}") })
}

/// The key whose record starts at `start`: its length (a varint), then its bytes.
fn record_at(arena: &[u8], start: u32) -> Option<&[u8]> {
    let mut reader = PayloadReader::new(arena.get(start as usize..)?);
    let len = reader.varint().ok()?;
    reader.take(len).ok()
}

/// The bytes a key of `len` bytes takes in the arena.
fn record_len(len: usize) -> usize {
    varint_len(len as u64) + len
}

fn too_many(what: &str) -> CoreError {
    CoreError::Encode { reason: format!("a partition's key table is past 4 Gi {what}") }
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
        Self::encode_in_order(entries.iter().map(|(id, value)| (*id, value)), entries.len())
    }

    /// Encodes `entries`, ids ascending, about `len` of them.
    pub(crate) fn encode_in_order<'a, V: Serialize + 'a>(
        entries: impl Iterator<Item = (u32, &'a V)>,
        len: usize,
    ) -> Result<Self, CoreError> {
        let mut bytes = Vec::with_capacity(len * 3);
        let (mut previous, mut count) = (0u32, 0u32);
        for (id, value) in entries {
            let gap = id.checked_sub(previous).ok_or_else(|| CoreError::Encode {
                reason: format!("a window slice's ids out of order: {id} after {previous}"),
            })?;
            write_varint(u64::from(gap), &mut bytes);
            previous = id;
            count = count.saturating_add(1);
            bincode::serde::encode_into_std_write(value, &mut bytes, bincode::config::standard())
                .map_err(|e| CoreError::Encode { reason: format!("a window slice's value: {e}") })?;
        }
        bytes.shrink_to_fit();
        Ok(EncodedSlice { bytes, entries: count })
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries as usize
    }

    /// The bytes the slice takes.
    pub(crate) fn encoded_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Calls `each` with every entry, in id order.
    pub(crate) fn for_each<V: DeserializeOwned>(&self, mut each: impl FnMut(u32, V)) -> Result<(), CoreError> {
        let (mut reader, mut id) = (PayloadReader::new(&self.bytes), 0u32);
        for _ in 0..self.entries {
            let gap = u32::try_from(reader.varint()?).map_err(|_| corrupt("a gap past u32"))?;
            id = id.checked_add(gap).ok_or_else(|| corrupt("an id past u32"))?;
            let (value, used): (V, usize) =
                bincode::serde::decode_from_slice(reader.rest(), bincode::config::standard())
                    .map_err(|e| corrupt(&format!("a value: {e}")))?;
            reader.take(used as u64)?;
            each(id, value);
        }
        reader.finish().map_err(|_| corrupt("bytes after the last entry"))
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

/// Bytes written as one byte string.
pub(crate) struct ByteString<'a>(pub(crate) &'a [u8]);

impl Serialize for ByteString<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// Bytes read as one byte string.
pub(crate) struct OwnedByteString(pub(crate) Vec<u8>);

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

/// Decodes a key the table stored. A `String`, the commonest key, is read
/// straight from its length and bytes: the generic decoder zeroes a buffer
/// before filling it, which at a million keys a slide is a measurable part
/// of the slide.
fn decode_key<K: DeserializeOwned + 'static>(bytes: &[u8]) -> Result<K, CoreError> {
    let failed = |e: &dyn std::fmt::Display| CoreError::Decode { reason: format!("a key of the key table: {e}") };
    let mut key: Option<K> = None;
    if let Some(text) = (&mut key as &mut dyn std::any::Any).downcast_mut::<Option<String>>() {
        let (len, used): (u64, usize) =
            bincode::decode_from_slice(bytes, bincode::config::standard()).map_err(|e| failed(&e))?;
        let utf8 = usize::try_from(len).ok().and_then(|len| bytes.get(used..used.checked_add(len)?));
        let utf8 = utf8.ok_or_else(|| failed(&"a string longer than its record"))?;
        *text = Some(std::str::from_utf8(utf8).map_err(|e| failed(&e))?.to_owned());
    }
    match key {
        Some(key) => Ok(key),
        None => bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map(|(key, _)| key)
            .map_err(|e| failed(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode<K: Key>(key: &K) -> Vec<u8> {
        bincode::serde::encode_to_vec(key, bincode::config::standard()).unwrap()
    }

    #[test]
    fn a_key_keeps_its_id_and_a_removed_keys_id_is_reused() {
        let mut table = KeyTable::default();
        let (a, b) = (table.insert(&"a".to_string()).unwrap(), table.insert(&"b".to_string()).unwrap());
        assert_eq!((a, b), (0, 1));
        assert_eq!(table.insert(&"a".to_string()).unwrap(), a);
        assert_eq!(table.key(b).unwrap().as_deref(), Some("b"));
        assert!(table.remove(a));
        assert_eq!(table.key(a).unwrap(), None);
        assert_eq!(table.insert(&"c".to_string()).unwrap(), a, "the freed id is given again");
        assert_eq!((table.len(), table.id_bound()), (2, 2));
        let listed: Vec<(u32, Vec<u8>)> = table.iter_encoded().map(|(id, k)| (id, k.to_vec())).collect();
        assert_eq!(listed, [(0, encode(&"c".to_string())), (1, encode(&"b".to_string()))]);
    }

    #[test]
    fn a_string_key_decodes_as_the_generic_decoder_reads_it() {
        let long = "é".repeat(300);
        for text in ["", "w42", long.as_str()] {
            assert_eq!(decode_key::<String>(&encode(&text.to_string())).unwrap(), text);
        }
        let pair = ("w7".to_string(), 9u32);
        assert_eq!(decode_key::<(String, u32)>(&encode(&pair)).unwrap(), pair);
        let mut not_utf8 = encode(&"ab".to_string());
        not_utf8[1] = 0xff;
        assert!(decode_key::<String>(&not_utf8).is_err());
        let cut = encode(&"abc".to_string());
        assert!(decode_key::<String>(&cut[..cut.len() - 1]).is_err());
        assert!(bincode::serde::decode_from_slice::<String, _>(&not_utf8, bincode::config::standard()).is_err());
    }

    #[test]
    fn keys_taken_in_groups_get_the_ids_one_by_one_would_give_at_any_table_size() {
        // Past LOOK_AHEAD_FROM keys the groups are looked up ahead; a
        // removed key frees an id for the next new key to take.
        // Keys encoded beforehand, in two parts appended, take the same ids.
        let keys = LOOK_AHEAD_FROM as u64 * 3;
        let (mut grouped, mut single) = (KeyTable::<String>::default(), KeyTable::<String>::default());
        let mut encoded = KeyTable::<String>::default();
        for round in 0..3u64 {
            let batch: Vec<String> = (0..keys).map(|n| format!("w{}", (n * 7 + round * 1_000) % keys)).collect();
            let (mut ids, mut given) = (Vec::new(), Vec::new());
            grouped.insert_many(batch.clone(), &mut ids, |id| given.push(id)).unwrap();
            let (mut first, mut second) = (EncodedKeys::default(), EncodedKeys::default());
            let (head, tail) = batch.split_at(batch.len() / 3);
            head.iter().for_each(|key| first.push(key).unwrap());
            tail.iter().for_each(|key| second.push(key).unwrap());
            first.append(&second).unwrap();
            assert_eq!(first.len(), batch.len());
            let (mut encoded_ids, mut encoded_given) = (Vec::new(), Vec::new());
            encoded.insert_many_encoded(&first, &mut encoded_ids, |id| encoded_given.push(id)).unwrap();
            assert_eq!((&encoded_ids, &encoded_given), (&ids, &given), "round {round}");
            let mut expected_given = Vec::new();
            let expected: Vec<u32> = batch
                .iter()
                .map(|key| {
                    let known = single.len();
                    let id = single.insert(key).unwrap();
                    if single.len() > known {
                        expected_given.push(id);
                    }
                    id
                })
                .collect();
            assert_eq!(ids, expected, "round {round}");
            assert_eq!(given, expected_given, "round {round}");
            for id in [round as u32, 100 + round as u32] {
                assert_eq!(grouped.remove(id), single.remove(id));
                encoded.remove(id);
            }
        }
        assert_eq!(grouped.key(5).unwrap(), single.key(5).unwrap());
    }

    #[test]
    fn keys_placed_by_id_are_found_and_the_gaps_are_free() {
        let mut table: KeyTable<u64> = KeyTable::default();
        table.insert_at(3, &encode(&30u64)).unwrap();
        table.insert_at(1, &encode(&10u64)).unwrap();
        table.rebuild_free();
        assert_eq!((table.insert(&30).unwrap(), table.insert(&10).unwrap()), (3, 1));
        assert_eq!(table.key(3).unwrap(), Some(30));
        let mut given: Vec<u32> = (0..3).map(|k| table.insert(&(100 + k)).unwrap()).collect();
        given.sort_unstable();
        assert_eq!(given, [0, 2, 4]);
        assert!(table.insert_at(0, &encode(&30u64)).is_err(), "a key under two ids is refused");
        // Past many growths of the index every key is still found.
        let mut many: KeyTable<u64> = KeyTable::default();
        let ids: Vec<u32> = (0..10_000u64).map(|k| many.insert(&k).unwrap()).collect();
        assert!((0..10_000u64).all(|k| many.insert(&k).ok() == ids.get(k as usize).copied()));
        assert_eq!(many.len(), 10_000);
    }

    #[test]
    fn the_arena_is_compacted_once_most_of_it_is_garbage_and_keys_survive_it() {
        let mut table: KeyTable<String> = KeyTable::default();
        let key = |n: u32| format!("key-{n:0>200}");
        let ids: Vec<u32> = (0..20_000).map(|n| table.insert(&key(n)).unwrap()).collect();
        let full = table.arena.len();
        for id in ids.iter().filter(|id| **id % 4 != 0) {
            assert!(table.remove(*id));
        }
        assert!(table.arena.len() < full * 3 / 4, "compacted: {} of {full} bytes", table.arena.len());
        for (n, id) in ids.iter().enumerate().filter(|(_, id)| **id % 4 == 0) {
            assert_eq!(table.key(*id).unwrap(), Some(key(n as u32)));
            assert_eq!(table.insert(&key(n as u32)).unwrap(), *id);
        }
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
    fn a_slice_encoded_in_order_is_the_slice_sorted_first_and_ids_out_of_order_are_refused() {
        let entries = [(2u32, 7u64), (40, 1), (41, 300)];
        let in_order = EncodedSlice::encode_in_order(entries.iter().map(|(id, v)| (*id, v)), 1).unwrap();
        assert_eq!(in_order, EncodedSlice::encode(&mut [(41u32, 300u64), (2, 7), (40, 1)]).unwrap());
        assert_eq!(in_order.decode::<u64>().unwrap(), entries);
        assert!(EncodedSlice::encode_in_order([(5u32, &1u64), (4, &2)].into_iter(), 2).is_err());
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
