//! Keyed state beyond the memory budget: the store it moves to.
//!
//! A `map_with_state` partition keeps its keys and states in memory (a
//! [`KeyTable`](crate::keyed::KeyTable) and an array) until they take more
//! than its share of the state budget; from then on they live in a
//! [`SpillTable`], and the partition holds only what one batch touches.
//! The graph does no I/O of its own: the runtime hands it a
//! [`SpillStore`] (RocksDB on local disk), tests an in-memory one with a
//! failpoint.
//!
//! A table is scratch, not the state's record: a checkpoint holds the
//! state (the same snapshot format whether a partition is in memory or
//! spilled), and a restarted job restores from it into a new table. So a
//! store needs no log of its own, and a table goes when its handle does.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spate_core::CoreError;
use spate_core::sync::lock;
use thiserror::Error;

/// A store that hands out tables of spilled state.
pub trait SpillStore: Send + Sync + fmt::Debug {
    /// A new, empty table; `name` is unique within the store.
    fn open_table(&self, name: &str) -> Result<Box<dyn SpillTable>, SpillError>;

    /// A new, empty set of blobs; `name` is unique within the store.
    fn open_blobs(&self, name: &str) -> Result<Box<dyn SpillBlobs>, SpillError>;
}

/// Values written once and read back whole, by number: spilled state that
/// is never looked up by key (an inverse window's retained slices, a
/// spilled `map_with_state` partition's changes a batch). A
/// store may keep them apart from its tables, in plain files, so they
/// cost no memory of the store's own.
pub trait SpillBlobs: Send {
    /// Keeps `bytes` as blob `number` (new).
    fn put(&mut self, number: u64, bytes: &[u8]) -> Result<(), SpillError>;

    /// Blob `number`'s bytes, or `None` when there is none.
    fn get(&self, number: u64) -> Result<Option<Vec<u8>>, SpillError>;

    /// Removes blob `number`.
    fn remove(&mut self, number: u64) -> Result<(), SpillError>;
}

/// An ordered map from bytes to bytes: one partition's spilled state.
pub trait SpillTable: Send {
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, SpillError>;

    /// Applies `writes` at once, in their order.
    fn write(&mut self, writes: &SpillWrites) -> Result<(), SpillError>;

    /// The values of `keys` (sorted, distinct), in their order: one read
    /// for a batch's keys, which a store may do faster than one by one.
    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, SpillError> {
        keys.iter().map(|key| self.get(key)).collect()
    }

    /// Calls `visit` with each entry whose key starts with `prefix`, is not
    /// before `from` and (with `until`) is before `until`, in key order,
    /// while it returns `true`.
    ///
    /// The bounds are the store's to keep: a store that deletes by writing
    /// a marker (RocksDB) then steps over no deleted entry beyond them,
    /// where a visitor stopping at the first entry out of range would
    /// first step over every deleted one before it.
    fn scan_range(
        &self,
        prefix: &[u8],
        from: &[u8],
        until: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), SpillError>;

    /// Calls `visit` with each entry whose key starts with `prefix`, in key
    /// order, while it returns `true`.
    fn scan(&self, prefix: &[u8], visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<(), SpillError> {
        self.scan_range(prefix, prefix, None, visit)
    }
}

/// A spill store or table failed: the store's own words.
#[derive(Debug, Error)]
#[error("spilled state ({store}): {reason}")]
pub struct SpillError {
    /// Which store (a path, or "memory").
    pub store: String,
    /// What it said.
    pub reason: String,
}

impl SpillError {
    /// As the operator's state error when a read failed.
    pub(crate) fn reading(self) -> CoreError {
        CoreError::Decode { reason: self.to_string() }
    }

    /// As the operator's state error when a write (or opening a table) failed.
    pub(crate) fn writing(self) -> CoreError {
        CoreError::Encode { reason: self.to_string() }
    }
}

/// Puts and deletes to apply to a [`SpillTable`] at once.
#[derive(Debug, Default)]
pub struct SpillWrites {
    entries: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl SpillWrites {
    /// Sets `key` to `value`.
    pub fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        self.entries.push((key, Some(value)));
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: Vec<u8>) {
        self.entries.push((key, None));
    }

    /// The writes in order: a key with its new value, or `None` to remove it.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.entries.iter().map(|(key, value)| (key.as_slice(), value.as_deref()))
    }

    /// The number of writes.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Where keyed state goes beyond its budget, as the graph is given it
/// ([`Graph::spill_state`](crate::Graph::spill_state)).
#[derive(Clone, Debug)]
pub struct StateSpill {
    store: Arc<dyn SpillStore>,
    budget_bytes: u64,
    tables: Arc<AtomicU64>,
}

impl StateSpill {
    /// Keyed state of one operator that takes more than `budget_bytes` in
    /// memory moves to tables of `store`, partition by partition.
    pub fn new(store: Arc<dyn SpillStore>, budget_bytes: u64) -> Self {
        StateSpill { store, budget_bytes, tables: Arc::new(AtomicU64::new(0)) }
    }

    /// The bytes one partition of an operator's state may take in memory
    /// when the operator has `partitions`.
    pub(crate) fn partition_budget(&self, partitions: usize) -> u64 {
        self.budget_bytes / partitions.max(1) as u64
    }

    /// A new table for a partition of `operator`.
    pub(crate) fn open(&self, operator: &str) -> Result<Box<dyn SpillTable>, SpillError> {
        self.store.open_table(&self.unique_name(operator))
    }

    /// A new set of blobs for a partition of `operator`.
    pub(crate) fn open_blobs(&self, operator: &str) -> Result<Box<dyn SpillBlobs>, SpillError> {
        self.store.open_blobs(&self.unique_name(operator))
    }

    /// `operator` as a name safe in a path, numbered apart from the others.
    fn unique_name(&self, operator: &str) -> String {
        let n = self.tables.fetch_add(1, Ordering::Relaxed);
        let safe: String =
            operator.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        format!("{safe}-{n}")
    }
}

/// The spill an operator's partitions use, with the operator's name for
/// its tables.
#[derive(Clone)]
pub(crate) struct SpillPlace {
    operator: String,
    spill: StateSpill,
}

impl SpillPlace {
    pub(crate) fn new(operator: &str, spill: &StateSpill) -> Self {
        SpillPlace { operator: operator.to_string(), spill: spill.clone() }
    }

    pub(crate) fn operator(&self) -> &str {
        &self.operator
    }

    /// The bytes one of the operator's `partitions` may keep in memory.
    pub(crate) fn partition_budget(&self, partitions: usize) -> u64 {
        self.spill.partition_budget(partitions)
    }

    /// A new table for one of the operator's partitions.
    pub(crate) fn open(&self) -> Result<Box<dyn SpillTable>, CoreError> {
        self.spill.open(&self.operator).map_err(SpillError::writing)
    }

    /// A new set of blobs for one of the operator's partitions.
    pub(crate) fn open_blobs(&self) -> Result<Box<dyn SpillBlobs>, CoreError> {
        self.spill.open_blobs(&self.operator).map_err(SpillError::writing)
    }
}

/// A [`SpillStore`] in memory, for tests: it shows that the spilled path
/// gives the same results, and its failpoint makes the tables fail.
#[derive(Debug, Default)]
pub struct MemorySpillStore {
    shared: Arc<MemoryShared>,
}

#[derive(Debug, Default)]
struct MemoryShared {
    /// Writes and reads left before every table fails (`u64::MAX`: never).
    fail_after: AtomicU64,
    opened: AtomicU64,
}

impl MemorySpillStore {
    /// A store whose tables never fail.
    pub fn new() -> Self {
        let store = MemorySpillStore::default();
        store.shared.fail_after.store(u64::MAX, Ordering::Relaxed);
        store
    }

    /// Makes every table fail once `operations` more reads and writes have
    /// been done (over all tables).
    pub fn fail_after(&self, operations: u64) {
        self.shared.fail_after.store(operations, Ordering::Relaxed);
    }

    /// The number of tables and sets of blobs opened so far.
    pub fn tables_opened(&self) -> u64 {
        self.shared.opened.load(Ordering::Relaxed)
    }
}

impl SpillStore for MemorySpillStore {
    fn open_table(&self, name: &str) -> Result<Box<dyn SpillTable>, SpillError> {
        self.shared.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(MemoryTable {
            name: name.to_string(),
            entries: Mutex::new(BTreeMap::new()),
            shared: Arc::clone(&self.shared),
        }))
    }

    fn open_blobs(&self, name: &str) -> Result<Box<dyn SpillBlobs>, SpillError> {
        self.shared.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(MemoryBlobs { name: name.to_string(), blobs: BTreeMap::new(), shared: Arc::clone(&self.shared) }))
    }
}

struct MemoryTable {
    name: String,
    entries: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    shared: Arc<MemoryShared>,
}

impl MemoryTable {
    fn operation(&self) -> Result<(), SpillError> {
        self.shared.operation(&self.name)
    }
}

impl MemoryShared {
    /// Counts one read or write of `name`, failing at the failpoint.
    fn operation(&self, name: &str) -> Result<(), SpillError> {
        let left = self.fail_after.load(Ordering::Relaxed);
        if left == 0 {
            return Err(SpillError { store: "memory".into(), reason: format!("{name}: failpoint") });
        }
        if left != u64::MAX {
            self.fail_after.store(left - 1, Ordering::Relaxed);
        }
        Ok(())
    }
}

struct MemoryBlobs {
    name: String,
    blobs: BTreeMap<u64, Vec<u8>>,
    shared: Arc<MemoryShared>,
}

impl SpillBlobs for MemoryBlobs {
    fn put(&mut self, number: u64, bytes: &[u8]) -> Result<(), SpillError> {
        self.shared.operation(&self.name)?;
        self.blobs.insert(number, bytes.to_vec());
        Ok(())
    }

    fn get(&self, number: u64) -> Result<Option<Vec<u8>>, SpillError> {
        self.shared.operation(&self.name)?;
        Ok(self.blobs.get(&number).cloned())
    }

    fn remove(&mut self, number: u64) -> Result<(), SpillError> {
        self.shared.operation(&self.name)?;
        self.blobs.remove(&number);
        Ok(())
    }
}

impl SpillTable for MemoryTable {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, SpillError> {
        self.operation()?;
        Ok(lock(&self.entries).get(key).cloned())
    }

    fn write(&mut self, writes: &SpillWrites) -> Result<(), SpillError> {
        self.operation()?;
        let mut entries = lock(&self.entries);
        for (key, value) in writes.iter() {
            match value {
                Some(value) => entries.insert(key.to_vec(), value.to_vec()),
                None => entries.remove(key),
            };
        }
        Ok(())
    }

    fn scan_range(
        &self,
        prefix: &[u8],
        from: &[u8],
        until: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), SpillError> {
        self.operation()?;
        let entries = lock(&self.entries);
        for (key, value) in entries.range(from.max(prefix).to_vec()..) {
            let before_end = until.is_none_or(|until| key.as_slice() < until);
            if !key.starts_with(prefix) || !before_end || !visit(key, value) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_table_scans_a_prefix_in_order_and_fails_at_its_failpoint() {
        let store = MemorySpillStore::new();
        let mut table = store.open_table("t").unwrap();
        let mut writes = SpillWrites::default();
        for key in [&b"b2"[..], b"a1", b"b1", b"c1"] {
            writes.put(key.to_vec(), key.to_vec());
        }
        writes.delete(b"c1".to_vec());
        table.write(&writes).unwrap();
        let mut seen = Vec::new();
        table
            .scan(b"b", &mut |key, _| {
                seen.push(key.to_vec());
                true
            })
            .unwrap();
        assert_eq!(seen, vec![b"b1".to_vec(), b"b2".to_vec()]);
        assert_eq!(table.get(b"c1").unwrap(), None);
        store.fail_after(1);
        assert!(table.get(b"a1").unwrap().is_some());
        let error = table.get(b"a1").unwrap_err();
        assert!(error.to_string().contains("failpoint"), "{error}");
    }
}
