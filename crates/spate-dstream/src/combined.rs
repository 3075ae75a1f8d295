//! Values combined by key: what a per-key aggregate makes of a block or a
//! batch, each key once.
//!
//! A hash table rather than a map, so that a fold can work on a group of
//! entries a step at a time. On a table of a million keys a lookup is a
//! chain of cache misses (the key's bytes to hash it, the bucket, the
//! stored key to compare), each waiting on the one before; key by key, the
//! CPU waits out every miss in turn. Hashing a whole group first, then
//! finding every one of its buckets, then comparing every one of its keys
//! makes the misses of each step independent of each other, so they
//! overlap; the lookups that then change the table find their lines in
//! cache. The same holds for [`KeyTable::insert_many`](crate::keyed).

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use crate::batch::Key;
use crate::hash::KeyHashState;

/// Entries worked on together: enough that a step's misses overlap, few
/// enough that the lines they bring stay in the first-level cache until
/// the group's last step.
pub(crate) const GROUP: usize = 16;

/// Below this many entries a table fits in the CPU's caches, and looking a
/// group up ahead would only add work.
pub(crate) const LOOK_AHEAD_FROM: usize = 1 << 14;

/// Values combined by key, each key once (see the module doc).
pub(crate) struct Combined<K, C> {
    table: HashTable<(K, C)>,
    hasher: KeyHashState,
}

impl<K, C> Default for Combined<K, C> {
    fn default() -> Self {
        Combined::with_capacity(0)
    }
}

impl<K, C> Combined<K, C> {
    /// An empty table with room for `capacity` keys.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Combined { table: HashTable::with_capacity(capacity), hasher: KeyHashState::default() }
    }

    /// The number of keys.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// True when it holds no key.
    pub(crate) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

impl<K: Key, C> Combined<K, C> {
    /// Folds `entries` in, in order: a key's first value becomes its
    /// combiner through `create`, later ones go into it through `merge`.
    pub(crate) fn fold<X>(
        &mut self,
        entries: impl IntoIterator<Item = (K, X)>,
        create: impl Fn(X) -> C,
        merge: impl Fn(&mut C, X),
    ) {
        let mut entries = entries.into_iter();
        let mut group: Vec<(u64, K, X)> = Vec::with_capacity(GROUP);
        loop {
            group.extend(entries.by_ref().take(GROUP).map(|(key, value)| (self.hasher.hash_one(&key), key, value)));
            if group.is_empty() {
                return;
            }
            if self.table.len() >= LOOK_AHEAD_FROM {
                self.look_ahead(&group);
            }
            for (hash, key, value) in group.drain(..) {
                let hasher = &self.hasher;
                match self.table.entry(hash, |(known, _)| *known == key, |(known, _)| hasher.hash_one(known)) {
                    Entry::Occupied(mut entry) => merge(&mut entry.get_mut().1, value),
                    Entry::Vacant(entry) => {
                        entry.insert((key, create(value)));
                    }
                }
            }
        }
    }

    /// Finds the buckets of a group's keys, then compares the keys found,
    /// each step for the whole group (see the module doc). What it finds is
    /// only brought into cache; the fold looks each key up again.
    fn look_ahead<X>(&self, group: &[(u64, K, X)]) {
        let found: [Option<&(K, C)>; GROUP] =
            std::array::from_fn(|index| group.get(index).and_then(|(hash, ..)| self.table.find(*hash, |_| true)));
        let same =
            found.iter().zip(group).filter(|(found, (_, key, _))| found.is_some_and(|(known, _)| known == key)).count();
        std::hint::black_box(same);
    }
}

impl<K, C> IntoIterator for Combined<K, C> {
    type Item = (K, C);
    type IntoIter = hashbrown::hash_table::IntoIter<(K, C)>;

    fn into_iter(self) -> Self::IntoIter {
        self.table.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_combines_each_key_once_in_order_at_any_size() {
        for keys in [3u64, 100, LOOK_AHEAD_FROM as u64 * 3] {
            let mut combined: Combined<u64, Vec<u64>> = Combined::default();
            let entries = (0..keys * 4).map(|n| (n % keys, n));
            combined.fold(entries, |n| vec![n], |acc, n| acc.push(n));
            assert_eq!(combined.len(), keys as usize);
            for (key, values) in combined {
                let expected: Vec<u64> = (0..4).map(|round| round * keys + key).collect();
                assert_eq!(values, expected, "key {key}");
            }
        }
    }
}
