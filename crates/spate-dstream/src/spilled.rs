//! One `map_with_state` partition whose keys and states live in a
//! [`SpillTable`] rather than in memory.
//!
//! The table holds each key's state: `S` + key → the state and the last
//! batch time the key had data, in the state codec's encoding (bincode).
//! A key's bytes followed by its value are the encoding of the
//! `(key, state, time)` a snapshot lists, so a snapshot is written from the
//! table without decoding.
//!
//! Two things look keys up by time, and each has a structure of its own,
//! so that a batch revisiting a key writes its state alone: one write a
//! key rather than three. At ten million keys, moving each revisited key
//! in one index by time had been about 45 % of a batch.
//!
//! - **Timeouts** (only with a timeout): `T` + a time + key → nothing, one
//!   entry a key, at a time no later than the key's last data. A new key
//!   enters at its time, and a key revisited keeps its entry. A batch
//!   reads the entries older than its timeout threshold with their keys'
//!   states: a key whose last data is older times out, and one with later
//!   data moves its entry to that time. So the index still finds every
//!   idle key, and a key moves in it at most once in a timeout's length,
//!   not at every visit (a key whose visits are nearly a timeout apart
//!   still moves about once a visit, with a read more). The entry of a
//!   key removed goes when the scan reaches it.
//! - **The changes since the last snapshot**: each batch keeps what it
//!   changed (its keys' new states, or that they went), sorted by key, in
//!   a blob of its own. An incremental snapshot merges those blobs, a
//!   key's latest change winning; a snapshot taken lets go of the blobs it
//!   covered. Changes that came in otherwise (a partition moving to its
//!   table) or beyond [`CHANGES_KEPT_BYTES`] are found by reading every
//!   key's time instead.
//!
//! A batch reads the keys it touches in one go, keeps what it changes in
//! memory (a [`Pending`] a key) and writes it all at once at its end.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;
use serde::de::DeserializeOwned;
use spate_core::{CoreError, PayloadReader, Time, write_varint};

use crate::spill::{SpillBlobs, SpillError, SpillTable, SpillWrites};

const STATE: u8 = b'S';
const BY_TIME: u8 = b'T';

/// Writes go to the table in groups of this many keys, so a partition
/// moving to its table does not hold a second copy of all its state.
pub(crate) const WRITE_GROUP: usize = 16 * 1024;

/// The batches' changes kept for the next snapshot, at most, in bytes a
/// partition: a snapshot reads them all into memory to merge them. Beyond
/// it they go, and the snapshot reads every key's time instead (most keys
/// changed by then anyway).
pub(crate) const CHANGES_KEPT_BYTES: usize = 32 << 20;

/// Called with a key's encoding and its entry's.
pub(crate) type EntryVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), CoreError> + 'a;

/// A partition's keyed state in a spill table.
pub(crate) struct SpilledStates {
    table: Box<dyn SpillTable>,
    changes: BatchChanges,
    /// Whether keys are indexed by time (the operator has a timeout).
    by_time: bool,
    /// Keys with state.
    len: u64,
    /// The timeout scan's moves and removals of index entries, written
    /// with the batch's changes.
    index_writes: SpillWrites,
}

/// An idle key's encoding, and its state as the batch starts.
pub(crate) type IdleKey<S> = (Vec<u8>, Pending<S>);

/// A key's state before and after the batch that touched it.
pub(crate) struct Pending<S> {
    /// The last time it had data before the batch, when it had state.
    pub(crate) before: Option<Time>,
    /// Its state and last time now (`None`: removed, or never had one).
    pub(crate) now: Option<(S, Time)>,
}

impl SpilledStates {
    /// An empty partition in `table`, keeping each batch's changes in
    /// `blobs`; `by_time`: keys are indexed by time, for timeouts.
    pub(crate) fn new(table: Box<dyn SpillTable>, blobs: Box<dyn SpillBlobs>, by_time: bool) -> Self {
        SpilledStates {
            table,
            changes: BatchChanges::new(blobs),
            by_time,
            len: 0,
            index_writes: SpillWrites::default(),
        }
    }

    /// The number of keys with state.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The state and last time of each of `keys` (sorted, distinct), as a
    /// batch starts with them, in one read.
    pub(crate) fn pending_many<S: DeserializeOwned>(&self, keys: &[Vec<u8>]) -> Result<Vec<Pending<S>>, CoreError> {
        let wanted: Vec<Vec<u8>> = keys.iter().map(|key| prefixed(STATE, key)).collect();
        let found = self.table.get_many(&wanted).map_err(SpillError::reading)?;
        found.into_iter().map(pending_of).collect()
    }

    /// [`SpilledStates::pending_many`] of `keys` (in any order, repeated
    /// or not), by key.
    pub(crate) fn pending_by_key<'a, S: DeserializeOwned>(
        &self,
        keys: impl Iterator<Item = &'a Vec<u8>>,
    ) -> Result<HashMap<Vec<u8>, Pending<S>>, CoreError> {
        let mut distinct: Vec<Vec<u8>> = keys.cloned().collect();
        distinct.sort_unstable();
        distinct.dedup();
        let found = self.pending_many::<S>(&distinct)?;
        Ok(distinct.into_iter().zip(found).collect())
    }

    /// The keys whose last data is older than `threshold`, each with its
    /// state as the batch starts. Their index entries go with the batch's
    /// writes (see [`SpilledStates::index_at`] for a key that stays); the
    /// entries the scan passed of keys with later data move to that time,
    /// and those of keys without state go.
    pub(crate) fn idle_before<S: DeserializeOwned>(&mut self, threshold: Time) -> Result<Vec<IdleKey<S>>, CoreError> {
        let mut passed: Vec<(Time, Vec<u8>)> = Vec::new();
        // Bounded by the threshold, not stopped at the first key past it:
        // the entries moved or removed before are deleted at their old
        // times, all before that first key.
        let until = time_key(threshold, &[]);
        self.table
            .scan_range(&[BY_TIME], &[BY_TIME], Some(&until), &mut |entry, _| {
                if let Some((at, key)) = split_time(entry) {
                    passed.push((at, key.to_vec()));
                }
                true
            })
            .map_err(SpillError::reading)?;
        let mut states: HashMap<Vec<u8>, Pending<S>> = self.pending_by_key(passed.iter().map(|(_, key)| key))?;
        let mut idle = Vec::new();
        for (at, key) in passed {
            self.index_writes.delete(time_key(at, &key));
            // A key met again here had two entries (removed, then given
            // state again): the first one met decided for both.
            let Some(last) = states.get(&key).map(|pending| pending.before) else { continue };
            match last {
                Some(last) if last < threshold => {
                    if let Some(pending) = states.remove(&key) {
                        idle.push((key, pending));
                    }
                }
                Some(last) => {
                    self.index_writes.put(time_key(last, &key), Vec::new());
                    states.remove(&key);
                }
                None => {
                    states.remove(&key);
                }
            }
        }
        Ok(idle)
    }

    /// Indexes the key encoded as `key` at `time` again: it was idle as
    /// [`SpilledStates::idle_before`] found it, and has data in the batch.
    pub(crate) fn index_at(&mut self, key: &[u8], time: Time) {
        self.index_writes.put(time_key(time, key), Vec::new());
    }

    /// Writes a batch's changes: every key it touched, by its encoding.
    /// With the batch's time they are also kept for the next incremental
    /// snapshot; without (state restored), they are not changes.
    pub(crate) fn write_pending<S: Serialize>(
        &mut self,
        pending: HashMap<Vec<u8>, Pending<S>>,
        batch: Option<Time>,
    ) -> Result<(), CoreError> {
        let mut writes = std::mem::take(&mut self.index_writes);
        let keeps = batch.is_some() && self.changes.keeps();
        let mut changed = Vec::with_capacity(if keeps { pending.len() } else { 0 });
        for (key, entry) in pending {
            let value = match (&entry.now, entry.before) {
                (Some((state, last)), before) => {
                    let value = encode(&(state, *last))?;
                    if before.is_none() {
                        self.len += 1;
                        if self.by_time {
                            writes.put(time_key(*last, &key), Vec::new());
                        }
                    }
                    if batch.is_none() {
                        self.changes.came_otherwise(*last);
                    }
                    writes.put(prefixed(STATE, &key), value.clone());
                    Some(value)
                }
                (None, Some(_)) => {
                    // Its index entry, if any, goes when the timeout scan reaches it.
                    self.len = self.len.saturating_sub(1);
                    writes.delete(prefixed(STATE, &key));
                    None
                }
                (None, None) => continue,
            };
            if keeps {
                changed.push((key, value));
            }
            if writes.len() >= WRITE_GROUP {
                self.table.write(&std::mem::take(&mut writes)).map_err(SpillError::writing)?;
            }
        }
        self.table.write(&writes).map_err(SpillError::writing)?;
        match batch {
            Some(time) => self.changes.keep(time, changed),
            None => Ok(()),
        }
    }

    /// Adds entries (keys not in the table yet), as a partition moves to
    /// its table or a snapshot is restored into it.
    pub(crate) fn extend<'a, S: Serialize + 'a>(
        &mut self,
        entries: impl IntoIterator<Item = (&'a [u8], &'a S, Time)>,
    ) -> Result<(), CoreError> {
        let mut writes = SpillWrites::default();
        for (key, state, last) in entries {
            self.len += 1;
            self.changes.came_otherwise(last);
            if self.by_time {
                writes.put(time_key(last, key), Vec::new());
            }
            writes.put(prefixed(STATE, key), encode(&(state, last))?);
            if writes.len() >= WRITE_GROUP {
                self.table.write(&std::mem::take(&mut writes)).map_err(SpillError::writing)?;
            }
        }
        self.table.write(&writes).map_err(SpillError::writing)
    }

    /// Gives each key its state and last time, replacing any, as state is
    /// restored (not a batch's changes): one read and one write for all.
    pub(crate) fn upsert_many<S: Serialize + DeserializeOwned>(
        &mut self,
        entries: Vec<(Vec<u8>, S, Time)>,
    ) -> Result<(), CoreError> {
        let befores: HashMap<Vec<u8>, Pending<S>> = self.pending_by_key(entries.iter().map(|(key, ..)| key))?;
        let pending = entries.into_iter().map(|(key, state, last)| {
            let before = befores.get(&key).and_then(|pending| pending.before);
            (key, Pending { before, now: Some((state, last)) })
        });
        self.write_pending(pending.collect(), None)
    }

    /// Removes each key that has state, as state is restored.
    pub(crate) fn remove_many<S: DeserializeOwned>(&mut self, keys: Vec<Vec<u8>>) -> Result<(), CoreError> {
        let befores: HashMap<Vec<u8>, Pending<S>> = self.pending_by_key(keys.iter())?;
        let pending = befores.into_iter().filter_map(|(key, pending)| {
            pending.before.map(|before| (key, Pending::<()> { before: Some(before), now: None }))
        });
        self.write_pending(pending.collect(), None)
    }

    /// Calls `visit` with each key's encoding and its entry's encoding
    /// (the state, then the last time): every key, in key order, or with
    /// `changed_after` only the keys with data after that time.
    pub(crate) fn for_each_encoded<S: DeserializeOwned>(
        &self,
        changed_after: Option<Time>,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), CoreError> {
        match changed_after {
            Some(after) if self.changes.covers_after(after) => self.changes.merged_after(after, visit),
            _ => self.scan_states::<S>(changed_after, visit),
        }
    }

    /// [`SpilledStates::for_each_encoded`] from the states themselves.
    fn scan_states<S: DeserializeOwned>(
        &self,
        changed_after: Option<Time>,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), CoreError> {
        let mut failure = None;
        let mut each = |entry: &[u8], value: &[u8]| {
            let key = entry.get(1..).unwrap_or_default();
            let wanted = match changed_after {
                Some(after) => decode::<(S, Time)>(value).map(|(_, last)| last > after),
                None => Ok(true),
            };
            match wanted.and_then(|wanted| if wanted { visit(key, value) } else { Ok(()) }) {
                Ok(()) => true,
                Err(e) => {
                    failure = Some(e);
                    false
                }
            }
        };
        self.table.scan(&[STATE], &mut each).map_err(SpillError::reading)?;
        failure.map_or(Ok(()), Err)
    }

    /// A snapshot holds every change up to `time`: the batches' changes
    /// until then go.
    pub(crate) fn snapshot_taken(&mut self, time: Time) {
        self.changes.snapshot_taken(time);
    }
}

/// The changes of each batch since the last snapshot, a blob a batch.
struct BatchChanges {
    blobs: Box<dyn SpillBlobs>,
    /// The batches kept: time, blob number, size; oldest first.
    kept: VecDeque<(Time, u64, usize)>,
    /// The bytes of the blobs kept.
    bytes: usize,
    /// Beyond this many bytes the blobs go ([`CHANGES_KEPT_BYTES`]).
    bound: usize,
    next_number: u64,
    /// Changes up to this time may have come in without a blob (or had
    /// theirs dropped beyond the bound).
    missing_through: Option<Time>,
    /// The blobs went beyond the bound since the last snapshot, which
    /// therefore reads the states: no batch keeps its changes until then.
    beyond_bound: bool,
}

impl BatchChanges {
    fn new(blobs: Box<dyn SpillBlobs>) -> Self {
        BatchChanges {
            blobs,
            kept: VecDeque::new(),
            bytes: 0,
            bound: CHANGES_KEPT_BYTES,
            next_number: 0,
            missing_through: None,
            beyond_bound: false,
        }
    }

    /// A key got a state with data at `last` without a batch's blob.
    fn came_otherwise(&mut self, last: Time) {
        self.missing_through = Some(self.missing_through.map_or(last, |missing| missing.max(last)));
    }

    /// Whether the blobs hold every change after `after`.
    fn covers_after(&self, after: Time) -> bool {
        self.missing_through.is_none_or(|missing| missing <= after)
    }

    /// Whether a batch's changes are kept (not beyond the bound).
    fn keeps(&self) -> bool {
        !self.beyond_bound
    }

    /// Keeps batch `time`'s changes (a key's value, `None`: it went).
    fn keep(&mut self, time: Time, mut changed: Vec<(Vec<u8>, Option<Vec<u8>>)>) -> Result<(), CoreError> {
        if self.beyond_bound {
            self.came_otherwise(time);
            return Ok(());
        }
        if changed.is_empty() {
            return Ok(());
        }
        changed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut bytes = Vec::new();
        for (key, value) in &changed {
            write_varint(key.len() as u64, &mut bytes);
            bytes.extend_from_slice(key);
            // The value's length plus one; 0: the key went.
            write_varint(value.as_ref().map_or(0, |v| v.len() as u64 + 1), &mut bytes);
            bytes.extend_from_slice(value.as_deref().unwrap_or_default());
        }
        if self.bytes + bytes.len() > self.bound {
            self.forget_through(time);
            self.came_otherwise(time);
            self.beyond_bound = true;
            return Ok(());
        }
        let number = self.next_number;
        self.next_number += 1;
        self.blobs.put(number, &bytes).map_err(SpillError::writing)?;
        self.kept.push_back((time, number, bytes.len()));
        self.bytes += bytes.len();
        Ok(())
    }

    /// Lets go of the changes of the batches up to `time`: a snapshot
    /// holds them.
    fn snapshot_taken(&mut self, time: Time) {
        self.forget_through(time);
        self.beyond_bound = false;
    }

    /// Lets go of the changes of the batches up to `time`.
    fn forget_through(&mut self, time: Time) {
        while let Some(&(at, number, len)) = self.kept.front().filter(|(at, ..)| *at <= time) {
            self.kept.pop_front();
            self.bytes -= len;
            // Scratch: a blob not removed now goes with the store.
            if let Err(e) = self.blobs.remove(number) {
                tracing::warn!(batch = %at, error = %e, "a batch's spilled state changes were not removed");
            }
        }
    }

    /// Calls `visit` with each key changed after `after` that has state,
    /// and that state, in key order: the blobs merged, a key's latest
    /// change winning.
    fn merged_after(&self, after: Time, visit: &mut EntryVisitor<'_>) -> Result<(), CoreError> {
        let mut blobs = Vec::new();
        for &(_, number, _) in self.kept.iter().filter(|(at, ..)| *at > after) {
            let bytes = self.blobs.get(number).map_err(SpillError::reading)?;
            blobs.push(bytes.ok_or_else(|| CoreError::Decode {
                reason: format!("spilled state: the changes of batch blob {number} are missing"),
            })?);
        }
        // Oldest first: of the heads with the least key, the last wins.
        let mut readers: Vec<ChangeReader<'_>> =
            blobs.iter().map(|bytes| ChangeReader::new(bytes)).collect::<Result<_, _>>()?;
        loop {
            let Some(least) = readers.iter().filter_map(|r| r.head.map(|(key, _)| key)).min() else { return Ok(()) };
            let mut latest = None;
            for reader in readers.iter_mut().filter(|r| r.head.is_some_and(|(key, _)| key == least)) {
                latest = reader.head.map(|(_, value)| value);
                reader.advance()?;
            }
            if let Some(Some(value)) = latest {
                visit(least, value)?;
            }
        }
    }
}

/// Reads one batch's changes, a key at a time.
struct ChangeReader<'a> {
    reader: PayloadReader<'a>,
    head: Option<(&'a [u8], Option<&'a [u8]>)>,
}

impl<'a> ChangeReader<'a> {
    fn new(bytes: &'a [u8]) -> Result<Self, CoreError> {
        let mut reader = ChangeReader { reader: PayloadReader::new(bytes), head: None };
        reader.advance()?;
        Ok(reader)
    }

    fn advance(&mut self) -> Result<(), CoreError> {
        if self.reader.rest().is_empty() {
            self.head = None;
            return Ok(());
        }
        let len = self.reader.varint()?;
        let key = self.reader.take(len)?;
        let value = match self.reader.varint()? {
            0 => None,
            len => Some(self.reader.take(len - 1)?),
        };
        self.head = Some((key, value));
        Ok(())
    }
}

/// A key's [`Pending`] as a batch starts with it, from its state entry.
fn pending_of<S: DeserializeOwned>(entry: Option<Vec<u8>>) -> Result<Pending<S>, CoreError> {
    let now: Option<(S, Time)> = entry.map(|bytes| decode(&bytes)).transpose()?;
    Ok(Pending { before: now.as_ref().map(|(_, last)| *last), now })
}

fn prefixed(kind: u8, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 1);
    out.push(kind);
    out.extend_from_slice(key);
    out
}

/// `T`, then `time` so that byte order is time order, then the key.
fn time_key(time: Time, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 9);
    out.push(BY_TIME);
    out.extend_from_slice(&order_preserving(time).to_be_bytes());
    out.extend_from_slice(key);
    out
}

fn order_preserving(time: Time) -> u64 {
    (time.as_millis() as u64) ^ (1 << 63)
}

fn split_time(entry: &[u8]) -> Option<(Time, &[u8])> {
    let bits = u64::from_be_bytes(entry.get(1..9)?.try_into().ok()?);
    Some((Time::from_millis((bits ^ (1 << 63)) as i64), entry.get(9..)?))
}

pub(crate) fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CoreError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
        .map_err(|e| CoreError::Encode { reason: format!("spilled state: {e}") })
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CoreError> {
    decode_prefix(bytes).map(|(value, _)| value)
}

/// The value encoded at the start of `bytes`, and how many bytes it took:
/// an entry's state is its first bytes, before its last time.
pub(crate) fn decode_prefix<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, usize), CoreError> {
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map_err(|e| CoreError::Decode { reason: format!("spilled state: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spill::{MemorySpillStore, SpillStore};

    fn spilled(by_time: bool) -> SpilledStates {
        let store = MemorySpillStore::new();
        SpilledStates::new(store.open_table("t").unwrap(), store.open_blobs("b").unwrap(), by_time)
    }

    fn at(millis: i64) -> Time {
        Time::from_millis(millis)
    }

    /// A batch at `time` giving each key its state (`None`: removing it).
    fn batch(part: &mut SpilledStates, time: i64, keys: &[(&str, Option<u64>)]) {
        let mut pending = HashMap::new();
        for (key, state) in keys {
            let key = encode(key).unwrap();
            let before = read(part, &key).before;
            pending.insert(key, Pending { before, now: state.map(|s| (s, at(time))) });
        }
        part.write_pending(pending, Some(at(time))).unwrap();
    }

    fn read(part: &SpilledStates, key: &[u8]) -> Pending<u64> {
        part.pending_many(&[key.to_vec()]).unwrap().pop().unwrap()
    }

    /// The time index: (time, key) in order.
    fn index(part: &SpilledStates) -> Vec<(i64, String)> {
        let mut entries = Vec::new();
        part.table
            .scan(&[BY_TIME], &mut |entry, _| {
                let (time, key) = split_time(entry).unwrap();
                entries.push((time.as_millis(), decode::<String>(key).unwrap()));
                true
            })
            .unwrap();
        entries
    }

    /// The keys idle before `threshold`, timed out as the batch at `time` does.
    fn time_out(part: &mut SpilledStates, threshold: i64, time: i64) -> Vec<(String, u64)> {
        let idle = part.idle_before::<u64>(at(threshold)).unwrap();
        let mut out = Vec::new();
        let mut pending = HashMap::new();
        for (key, idle) in idle {
            out.push((decode::<String>(&key).unwrap(), idle.now.unwrap().0));
            pending.insert(key, Pending::<u64> { before: idle.before, now: None });
        }
        part.write_pending(pending, Some(at(time))).unwrap();
        out
    }

    /// The keys `for_each_encoded` lists as changed after `after`, with their states.
    fn changed_after(part: &SpilledStates, after: Option<i64>) -> Vec<(String, u64)> {
        let mut changed = Vec::new();
        part.for_each_encoded::<u64>(after.map(at), &mut |key, value| {
            changed.push((decode::<String>(key)?, decode::<(u64, Time)>(value)?.0));
            Ok(())
        })
        .unwrap();
        changed
    }

    #[test]
    fn keys_come_back_with_their_state_and_time_out_once_their_last_data_is_older() {
        let mut part = spilled(true);
        batch(&mut part, -5, &[("a", Some(1))]);
        batch(&mut part, 7, &[("b", Some(2))]);
        assert_eq!(part.len(), 2);
        let got = read(&part, &encode("b").unwrap());
        assert_eq!((got.before, got.now), (Some(at(7)), Some((2, at(7)))));
        let keys = [encode("a").unwrap(), encode("c").unwrap()];
        let many: Vec<Pending<u64>> = part.pending_many(&keys).unwrap();
        assert_eq!(many.iter().map(|p| p.now).collect::<Vec<_>>(), vec![Some((1, at(-5))), None]);
        assert_eq!(time_out(&mut part, 7, 8), vec![("a".to_string(), 1)]);
        assert_eq!(part.len(), 1);
        assert_eq!(index(&part), vec![(7, "b".to_string())], "a's entry went with it");
        assert_eq!(time_out(&mut part, 100, 101), vec![("b".to_string(), 2)]);
        assert_eq!((part.len(), index(&part)), (0, vec![]));
    }

    #[test]
    fn a_revisited_key_keeps_its_entry_until_the_scan_passes_it_then_moves_to_its_last_data() {
        let mut part = spilled(true);
        for time in [1, 2, 3] {
            batch(&mut part, time, &[("a", Some(time as u64))]);
        }
        assert_eq!(index(&part), vec![(1, "a".to_string())], "one entry, at its first data");
        assert_eq!(time_out(&mut part, 3, 4), vec![], "its last data (3) is not before 3");
        assert_eq!(index(&part), vec![(3, "a".to_string())], "moved to its last data");
        assert_eq!(time_out(&mut part, 4, 5), vec![("a".to_string(), 3)]);
        assert_eq!(index(&part), vec![]);
    }

    #[test]
    fn a_removed_keys_entry_goes_when_the_scan_reaches_it_even_with_state_again() {
        let mut part = spilled(true);
        batch(&mut part, 1, &[("a", Some(1)), ("b", Some(1))]);
        batch(&mut part, 2, &[("a", None), ("b", None)]);
        batch(&mut part, 3, &[("a", Some(3))]);
        assert_eq!(index(&part), vec![(1, "a".to_string()), (1, "b".to_string()), (3, "a".to_string())]);
        assert_eq!(time_out(&mut part, 3, 4), vec![], "a has data at 3, b no state");
        assert_eq!(index(&part), vec![(3, "a".to_string())], "one entry left, at a's last data");
        assert_eq!(part.len(), 1);
    }

    #[test]
    fn without_a_timeout_no_key_is_indexed_by_time() {
        let mut part = spilled(false);
        batch(&mut part, 1, &[("a", Some(1))]);
        part.extend([(encode("b").unwrap().as_slice(), &2u64, at(1))]).unwrap();
        assert_eq!((part.len(), index(&part)), (2, vec![]));
    }

    #[test]
    fn the_changes_after_a_snapshot_are_the_batches_merged_each_keys_latest_winning() {
        let mut part = spilled(true);
        batch(&mut part, 1, &[("a", Some(1)), ("b", Some(1)), ("d", Some(1))]);
        batch(&mut part, 2, &[("a", Some(2)), ("b", None), ("c", Some(2))]);
        batch(&mut part, 3, &[("c", Some(3))]);
        let expected = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<Vec<_>>();
        assert_eq!(changed_after(&part, Some(0)), expected(&[("a", 2), ("c", 3), ("d", 1)]));
        assert_eq!(changed_after(&part, Some(1)), expected(&[("a", 2), ("c", 3)]));
        assert_eq!(changed_after(&part, None), expected(&[("a", 2), ("c", 3), ("d", 1)]), "every key");
        part.snapshot_taken(at(2));
        assert_eq!(part.changes.kept.len(), 1, "the blobs through 2 went");
        assert_eq!(changed_after(&part, Some(2)), expected(&[("c", 3)]));
    }

    #[test]
    fn changes_that_came_without_a_batch_or_beyond_the_bound_are_found_from_the_states() {
        let mut part = spilled(true);
        part.extend([(encode("a").unwrap().as_slice(), &1u64, at(5)), (encode("b").unwrap().as_slice(), &1u64, at(9))])
            .unwrap();
        batch(&mut part, 10, &[("c", Some(10))]);
        let expected = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect::<Vec<_>>();
        assert_eq!(changed_after(&part, Some(6)), expected(&[("b", 1), ("c", 10)]));
        assert_eq!(changed_after(&part, Some(9)), expected(&[("c", 10)]), "the blobs hold all after 9");
        part.changes.bound = part.changes.bytes;
        batch(&mut part, 11, &[("a", Some(11))]);
        assert!(part.changes.kept.is_empty(), "beyond the bound the blobs go");
        batch(&mut part, 12, &[("d", Some(12))]);
        assert!(part.changes.kept.is_empty(), "none is kept until the next snapshot");
        assert_eq!(changed_after(&part, Some(10)), expected(&[("a", 11), ("d", 12)]));
        assert_eq!(changed_after(&part, Some(9)), expected(&[("a", 11), ("c", 10), ("d", 12)]));
        part.snapshot_taken(at(12));
        batch(&mut part, 13, &[("b", Some(13))]);
        assert_eq!(part.changes.kept.len(), 1, "kept again after the snapshot");
        assert_eq!(changed_after(&part, Some(12)), expected(&[("b", 13)]));
    }
}
