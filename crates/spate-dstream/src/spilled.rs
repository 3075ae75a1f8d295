//! One `map_with_state` partition whose keys and states live in a
//! [`SpillTable`] rather than in memory.
//!
//! The table holds two kinds of entry, told apart by their first byte:
//!
//! - `S` + key → the key's state and the last batch time it had data;
//! - `T` + that time (big-endian, order-preserving) + key → the same
//!   value: the keys by last time. The keys timing out are a prefix of it,
//!   and the keys changed since a snapshot its suffix (a key's state
//!   changes only in a batch where it has data, which makes that batch its
//!   last), so neither is a pass over every key, and the changes are read
//!   in order rather than looked up one by one.
//!
//! Keys and states are in the state codec's encoding (bincode), and a
//! state entry's value is `(state, time)` encoded: a key's bytes followed
//! by its value are the encoding of the `(key, state, time)` a snapshot
//! lists, so a snapshot is written from the table without decoding.
//!
//! A batch reads the keys it touches in one go, keeps what it changes in
//! memory (a [`Pending`] a key) and writes it all at once at its end.

use std::collections::HashMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use spate_core::{CoreError, Time};

use crate::spill::{SpillError, SpillTable, SpillWrites};

const STATE: u8 = b'S';
const BY_TIME: u8 = b'T';

/// Writes go to the table in groups of this many keys, so a partition
/// moving to its table does not hold a second copy of all its state.
const WRITE_GROUP: usize = 16 * 1024;

/// Called with a key's encoding and its entry's.
pub(crate) type EntryVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), CoreError> + 'a;

/// A partition's keyed state in a spill table.
pub(crate) struct SpilledStates {
    table: Box<dyn SpillTable>,
    /// Keys with state.
    len: u64,
}

/// A key's state before and after the batch that touched it.
pub(crate) struct Pending<S> {
    /// The last time it had data before the batch, when it had state.
    pub(crate) before: Option<Time>,
    /// Its state and last time now (`None`: removed, or never had one).
    pub(crate) now: Option<(S, Time)>,
}

impl SpilledStates {
    /// An empty partition in `table`.
    pub(crate) fn new(table: Box<dyn SpillTable>) -> Self {
        SpilledStates { table, len: 0 }
    }

    /// The number of keys with state.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The state and last time of the key encoded as `key`, as a batch
    /// starts with it.
    pub(crate) fn pending<S: DeserializeOwned>(&self, key: &[u8]) -> Result<Pending<S>, CoreError> {
        let bytes = self.table.get(&prefixed(STATE, key)).map_err(SpillError::reading)?;
        pending_of(bytes)
    }

    /// [`SpilledStates::pending`] of each of `keys` (sorted, distinct), in
    /// one read.
    pub(crate) fn pending_many<S: DeserializeOwned>(&self, keys: &[Vec<u8>]) -> Result<Vec<Pending<S>>, CoreError> {
        let wanted: Vec<Vec<u8>> = keys.iter().map(|key| prefixed(STATE, key)).collect();
        let found = self.table.get_many(&wanted).map_err(SpillError::reading)?;
        found.into_iter().map(pending_of).collect()
    }

    /// The keys whose last data is older than `threshold`, oldest first,
    /// with that time.
    pub(crate) fn idle_before(&self, threshold: Time) -> Result<Vec<(Vec<u8>, Time)>, CoreError> {
        let mut idle = Vec::new();
        // Bounded by the threshold, not stopped at the first key past it:
        // the entries of keys that had data since are deleted at their old
        // times, all before that first key.
        let until = time_key(threshold, &[]);
        self.table
            .scan_range(&[BY_TIME], &[BY_TIME], Some(&until), &mut |entry, _| {
                if let Some((last, key)) = split_time(entry) {
                    idle.push((key.to_vec(), last));
                }
                true
            })
            .map_err(SpillError::reading)?;
        Ok(idle)
    }

    /// Writes a batch's changes: every key it touched, by its encoding.
    pub(crate) fn write_pending<S: Serialize>(
        &mut self,
        pending: HashMap<Vec<u8>, Pending<S>>,
    ) -> Result<(), CoreError> {
        let mut writes = SpillWrites::default();
        for (key, entry) in pending {
            if let Some(before) = entry.before {
                writes.delete(time_key(before, &key));
            }
            match (&entry.now, entry.before) {
                (Some((state, last)), before) => {
                    self.len += u64::from(before.is_none());
                    put(&mut writes, &key, state, *last)?;
                }
                (None, Some(_)) => {
                    self.len = self.len.saturating_sub(1);
                    writes.delete(prefixed(STATE, &key));
                }
                (None, None) => {}
            }
            if writes.len() >= WRITE_GROUP {
                self.table.write(&std::mem::take(&mut writes)).map_err(SpillError::writing)?;
            }
        }
        self.table.write(&writes).map_err(SpillError::writing)
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
            put(&mut writes, key, state, last)?;
            if writes.len() >= WRITE_GROUP {
                self.table.write(&std::mem::take(&mut writes)).map_err(SpillError::writing)?;
            }
        }
        self.table.write(&writes).map_err(SpillError::writing)
    }

    /// Removes the key encoded as `key`, if it has state.
    pub(crate) fn remove<S: DeserializeOwned>(&mut self, key: &[u8]) -> Result<(), CoreError> {
        let pending = self.pending::<S>(key)?;
        if pending.before.is_none() {
            return Ok(());
        }
        let mut single = HashMap::new();
        single.insert(key.to_vec(), Pending::<()> { before: pending.before, now: None });
        self.write_pending(single)
    }

    /// Calls `visit` with each key's encoding and its entry's encoding
    /// (the state, then the last time): every key, in key order, or with
    /// `changed_after` only the keys with data after that time.
    pub(crate) fn for_each_encoded(
        &self,
        changed_after: Option<Time>,
        visit: &mut EntryVisitor<'_>,
    ) -> Result<(), CoreError> {
        let mut failure = None;
        let mut each = |key: &[u8], value: &[u8]| match visit(key, value) {
            Ok(()) => true,
            Err(e) => {
                failure = Some(e);
                false
            }
        };
        match changed_after {
            Some(after) => {
                let from = time_key(Time::from_millis(after.as_millis().saturating_add(1)), &[]);
                self.table
                    .scan_from(&[BY_TIME], &from, &mut |entry, value| {
                        split_time(entry).is_none_or(|(_, key)| each(key, value))
                    })
                    .map_err(SpillError::reading)?;
            }
            None => self
                .table
                .scan(&[STATE], &mut |entry, value| each(entry.get(1..).unwrap_or_default(), value))
                .map_err(SpillError::reading)?,
        }
        failure.map_or(Ok(()), Err)
    }
}

/// Adds the puts that give the key encoded as `key` its state and last time.
fn put<S: Serialize>(writes: &mut SpillWrites, key: &[u8], state: &S, last: Time) -> Result<(), CoreError> {
    let value = encode(&(state, last))?;
    writes.put(time_key(last, key), value.clone());
    writes.put(prefixed(STATE, key), value);
    Ok(())
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
    bincode::serde::decode_from_slice(bytes, bincode::config::standard())
        .map(|(value, _)| value)
        .map_err(|e| CoreError::Decode { reason: format!("spilled state: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spill::{MemorySpillStore, SpillStore};

    fn spilled() -> SpilledStates {
        SpilledStates::new(MemorySpillStore::new().open_table("t").unwrap())
    }

    #[test]
    fn keys_come_back_with_their_state_and_time_out_in_time_order() {
        let mut part = spilled();
        let (a, b) = (encode("a").unwrap(), encode("b").unwrap());
        let mut pending = HashMap::new();
        pending.insert(a.clone(), Pending { before: None, now: Some((1u64, Time::from_millis(-5))) });
        pending.insert(b.clone(), Pending { before: None, now: Some((2u64, Time::from_millis(7))) });
        part.write_pending(pending).unwrap();
        assert_eq!(part.len(), 2);
        let got: Pending<u64> = part.pending(&b).unwrap();
        assert_eq!((got.before, got.now), (Some(Time::from_millis(7)), Some((2, Time::from_millis(7)))));
        let many: Vec<Pending<u64>> = part.pending_many(&[a.clone(), encode("c").unwrap()]).unwrap();
        assert_eq!(many.iter().map(|p| p.now).collect::<Vec<_>>(), vec![Some((1, Time::from_millis(-5))), None]);
        assert_eq!(part.idle_before(Time::from_millis(7)).unwrap(), vec![(a.clone(), Time::from_millis(-5))]);
        let mut changed = Vec::new();
        part.for_each_encoded(Some(Time::from_millis(-5)), &mut |key, _| {
            changed.push(key.to_vec());
            Ok(())
        })
        .unwrap();
        assert_eq!(changed, vec![b.clone()], "only b had data after -5");
        part.remove::<u64>(&a).unwrap();
        assert_eq!(part.len(), 1);
        assert!(part.idle_before(Time::from_millis(100)).unwrap().iter().all(|(key, _)| *key == b));
    }

    #[test]
    fn the_changed_keys_are_those_with_data_after_the_given_time() {
        let mut part = spilled();
        let mut pending = HashMap::new();
        for n in 0..10u32 {
            let now = Some((n, Time::from_millis(i64::from(n % 4))));
            pending.insert(encode(&n).unwrap(), Pending { before: None, now });
        }
        part.write_pending(pending).unwrap();
        let mut changed = Vec::new();
        part.for_each_encoded(Some(Time::from_millis(0)), &mut |key, _| {
            changed.push(decode::<u32>(key)?);
            Ok(())
        })
        .unwrap();
        changed.sort_unstable();
        assert_eq!(changed, vec![1, 2, 3, 5, 6, 7, 9], "the keys with data after time 0");
    }
}
