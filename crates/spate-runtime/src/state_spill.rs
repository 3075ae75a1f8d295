//! The store keyed state beyond the memory budget moves to: RocksDB on
//! local disk.
//!
//! One database for the process, opened when the first partition moves
//! there, in a fresh owner-only directory under the spill directory
//! (`spate-state-*`) that goes with the context. Each table is a key
//! prefix in it (four bytes, big-endian table number). The database is
//! scratch: a checkpoint holds the state, so RocksDB's own log is off and
//! a table dropped is one range deletion.
//!
//! Blobs (an inverse window's retained slices, and a spilled
//! `map_with_state` partition's changes a batch until its next snapshot:
//! written once and read back whole) are plain files beside the database,
//! in their own owner-only directory (`spate-slices-*`): a database's write
//! buffers and block cache would cost more memory than the blobs they
//! would hold.
//!
//! A keyed operator keeps in memory up to a quarter of
//! [`StreamingSettings::max_memory_bytes`](crate::StreamingSettings::max_memory_bytes)
//! of state; see `spate_dstream::Graph::spill_state` for what moves.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use spate_dstream::{SpillBlobs, SpillError, SpillStore, SpillTable, SpillWrites};

/// The share of the memory budget keyed state of one operator keeps in
/// memory before its partitions move to disk.
pub(crate) const STATE_SHARE_OF_MEMORY: u64 = 4;

/// RocksDB's write buffer: what a table's recent writes take in memory.
const WRITE_BUFFER_BYTES: usize = 16 << 20;
/// Files in level 0 that start a compaction (RocksDB's default, set so
/// that level 1's size follows it).
const LEVEL_ZERO_FILES_TO_COMPACT: i32 = 4;
/// Keys read at once by [`RocksTable::get_many`].
const READ_GROUP: usize = 256;
/// RocksDB's block cache: the keys a batch reads again.
const BLOCK_CACHE_BYTES: usize = 16 << 20;

/// The RocksDB store of spilled keyed state.
pub(crate) struct RocksStateStore {
    base: PathBuf,
    opened: OnceLock<Result<Arc<Opened>, String>>,
    next_table: AtomicU32,
    /// The directory of the blobs, made when the first set opens.
    blobs_dir: OnceLock<Result<Arc<tempfile::TempDir>, String>>,
}

struct Opened {
    db: rocksdb::DB,
    /// Removed (with the database's files) when the store goes.
    dir: tempfile::TempDir,
    writes: rocksdb::WriteOptions,
}

impl std::fmt::Debug for RocksStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStateStore").field("base", &self.base).finish_non_exhaustive()
    }
}

impl RocksStateStore {
    /// A store that opens its database under `base` when first used.
    pub(crate) fn new(base: &Path) -> Self {
        RocksStateStore {
            base: base.to_path_buf(),
            opened: OnceLock::new(),
            next_table: AtomicU32::new(0),
            blobs_dir: OnceLock::new(),
        }
    }

    fn opened(&self) -> Result<Arc<Opened>, SpillError> {
        let opened = self.opened.get_or_init(|| open(&self.base).map(Arc::new));
        opened.clone().map_err(|reason| SpillError { store: self.base.display().to_string(), reason })
    }
}

fn open(base: &Path) -> Result<Opened, String> {
    std::fs::create_dir_all(base).map_err(|e| format!("create {}: {e}", base.display()))?;
    let dir = tempfile::Builder::new()
        .prefix("spate-state-")
        .tempdir_in(base)
        .map_err(|e| format!("make a directory in {}: {e}", base.display()))?;
    let mut options = rocksdb::Options::default();
    options.create_if_missing(true);
    // Scratch on a local disk: reads that skip decompression are worth more than the space.
    options.set_compression_type(rocksdb::DBCompressionType::None);
    options.set_write_buffer_size(WRITE_BUFFER_BYTES);
    options.set_max_write_buffer_number(2);
    // A bloom filter in the write buffer: most keys a batch reads are not there.
    options.set_memtable_whole_key_filtering(true);
    options.set_memtable_prefix_bloom_ratio(0.1);
    // Level 1 the size of level 0 when it compacts (RocksDB's tuning
    // advice), and levels sized from the last: a compaction from level 0
    // then rewrites about as much as it brings, not four times more.
    options.set_level_zero_file_num_compaction_trigger(LEVEL_ZERO_FILES_TO_COMPACT);
    options.set_max_bytes_for_level_base(LEVEL_ZERO_FILES_TO_COMPACT as u64 * WRITE_BUFFER_BYTES as u64);
    options.set_target_file_size_base(WRITE_BUFFER_BYTES as u64);
    options.set_level_compaction_dynamic_level_bytes(true);
    let mut table = rocksdb::BlockBasedOptions::default();
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES).map_err(|e| format!("a block cache: {e}"))?;
    table.set_block_cache(&cache);
    table.set_bloom_filter(10.0, false);
    // Index and filter blocks in the cache too, so they count against it
    // rather than growing with the data; partitioned, so a lookup reads a
    // few KiB of them, not a file's whole filter (megabytes at millions of
    // keys, which a small cache would read again on every lookup).
    table.set_cache_index_and_filter_blocks(true);
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_pin_top_level_index_and_filter(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    options.set_block_based_table_factory(&table);
    // Opened by name so that `cf_handle` (which batched reads take) finds
    // it, and with the options above: a family opened by name alone takes
    // RocksDB's defaults (compressed blocks, no filter, 64 MiB buffers).
    let family = rocksdb::ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, options.clone());
    let db = rocksdb::DB::open_cf_descriptors(&options, dir.path(), [family])
        .map_err(|e| format!("open {}: {e}", dir.path().display()))?;
    let mut writes = rocksdb::WriteOptions::default();
    // Scratch: the checkpoint, not this database, is the state's record.
    writes.disable_wal(true);
    tracing::info!(path = %dir.path().display(), "keyed state beyond the memory budget goes to this directory");
    Ok(Opened { db, dir, writes })
}

impl SpillStore for RocksStateStore {
    fn open_table(&self, _name: &str) -> Result<Box<dyn SpillTable>, SpillError> {
        let opened = self.opened()?;
        let number = self.next_table.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(RocksTable { opened, prefix: number.to_be_bytes() }))
    }

    fn open_blobs(&self, name: &str) -> Result<Box<dyn SpillBlobs>, SpillError> {
        let parent = self.blobs_dir.get_or_init(|| make_blobs_dir(&self.base).map(Arc::new));
        let parent = parent.clone().map_err(|reason| SpillError { store: self.base.display().to_string(), reason })?;
        let dir = parent.path().join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| SpillError { store: dir.display().to_string(), reason: format!("create: {e}") })?;
        Ok(Box::new(FileBlobs { _parent: parent, dir }))
    }
}

fn make_blobs_dir(base: &Path) -> Result<tempfile::TempDir, String> {
    std::fs::create_dir_all(base).map_err(|e| format!("create {}: {e}", base.display()))?;
    let dir = tempfile::Builder::new()
        .prefix("spate-slices-")
        .tempdir_in(base)
        .map_err(|e| format!("make a directory in {}: {e}", base.display()))?;
    tracing::info!(path = %dir.path().display(), "window slices beyond the memory budget, and spilled keyed state's changes a batch, go to this directory");
    Ok(dir)
}

/// One set of blobs: a file each in a directory of its own, removed with it.
struct FileBlobs {
    /// Keeps the store's directory while the set is open.
    _parent: Arc<tempfile::TempDir>,
    dir: PathBuf,
}

impl FileBlobs {
    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:016x}"))
    }

    fn error(&self, op: &str, number: u64, e: std::io::Error) -> SpillError {
        SpillError { store: self.dir.display().to_string(), reason: format!("{op} blob {number}: {e}") }
    }
}

impl SpillBlobs for FileBlobs {
    fn put(&mut self, number: u64, bytes: &[u8]) -> Result<(), SpillError> {
        // Scratch: no sync, the checkpoint is the state's record.
        std::fs::write(self.path(number), bytes).map_err(|e| self.error("write", number, e))
    }

    fn get(&self, number: u64) -> Result<Option<Vec<u8>>, SpillError> {
        match std::fs::read(self.path(number)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.error("read", number, e)),
        }
    }

    fn remove(&mut self, number: u64) -> Result<(), SpillError> {
        std::fs::remove_file(self.path(number)).map_err(|e| self.error("remove", number, e))
    }
}

impl Drop for FileBlobs {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(path = %self.dir.display(), error = %e, "spilled blobs were not removed; they go with the directory");
        }
    }
}

/// One table: the keys of the database that start with its prefix.
struct RocksTable {
    opened: Arc<Opened>,
    prefix: [u8; 4],
}

impl RocksTable {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(key.len() + self.prefix.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(key);
        out
    }

    fn error(&self, op: &str, e: rocksdb::Error) -> SpillError {
        SpillError { store: self.opened.dir.path().display().to_string(), reason: format!("{op}: {e}") }
    }
}

impl SpillTable for RocksTable {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, SpillError> {
        self.opened.db.get(self.key(key)).map_err(|e| self.error("get", e))
    }

    fn get_many(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, SpillError> {
        let default = self.opened.db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME).ok_or_else(|| SpillError {
            store: self.opened.dir.path().display().to_string(),
            reason: "no default column family".into(),
        })?;
        let mut values = Vec::with_capacity(keys.len());
        // In groups: each value found pins its block in the cache until
        // copied out, so a whole batch's at once would pin most of the data.
        for group in keys.chunks(READ_GROUP) {
            let wanted: Vec<Vec<u8>> = group.iter().map(|key| self.key(key)).collect();
            for value in self.opened.db.batched_multi_get_cf(default, &wanted, true) {
                values.push(value.map_err(|e| self.error("get", e))?.map(|v| v.to_vec()));
            }
        }
        Ok(values)
    }

    fn write(&mut self, writes: &SpillWrites) -> Result<(), SpillError> {
        if writes.is_empty() {
            return Ok(());
        }
        // In key order (stable: writes to one key keep theirs): the memtable
        // then inserts each next to the one before instead of searching for
        // its place from the top.
        let mut sorted: Vec<(&[u8], Option<&[u8]>)> = writes.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(b.0));
        let mut batch = rocksdb::WriteBatch::default();
        for (key, value) in sorted {
            match value {
                Some(value) => batch.put(self.key(key), value),
                None => batch.delete(self.key(key)),
            }
        }
        self.opened.db.write_opt(batch, &self.opened.writes).map_err(|e| self.error("write", e))
    }

    fn scan_range(
        &self,
        prefix: &[u8],
        from: &[u8],
        until: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), SpillError> {
        let (prefix, from) = (self.key(prefix), self.key(from.max(prefix)));
        let mut reads = rocksdb::ReadOptions::default();
        // Without an end, the prefix's own (none when it is all 0xff bytes:
        // the keys then run to the database's end).
        if let Some(end) = until.map(|until| self.key(until)).or_else(|| successor(&prefix)) {
            reads.set_iterate_upper_bound(end);
        }
        let mode = rocksdb::IteratorMode::From(&from, rocksdb::Direction::Forward);
        for item in self.opened.db.iterator_opt(mode, reads) {
            let (key, value) = item.map_err(|e| self.error("scan", e))?;
            let Some(key) = key.strip_prefix(prefix.as_slice()).map(|_| &key[self.prefix.len()..]) else { break };
            if !visit(key, &value) {
                break;
            }
        }
        Ok(())
    }
}

/// The first key after every key that starts with `prefix`, if any.
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let last = prefix.iter().rposition(|byte| *byte != u8::MAX)?;
    let mut end = prefix.get(..=last)?.to_vec();
    *end.last_mut()? += 1;
    Some(end)
}

impl Drop for RocksTable {
    fn drop(&mut self) {
        let next = u32::from_be_bytes(self.prefix).checked_add(1).map(u32::to_be_bytes);
        let end = next.map_or_else(|| vec![0xff; 5], |n| n.to_vec());
        let mut batch = rocksdb::WriteBatch::default();
        batch.delete_range(self.prefix.to_vec(), end);
        if let Err(e) = self.opened.db.write_opt(batch, &self.opened.writes) {
            tracing::warn!(error = %e, "a spilled state table was not deleted; its space goes with the directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_separate_ordered_and_gone_when_dropped() {
        let base = tempfile::tempdir().unwrap();
        let store = RocksStateStore::new(base.path());
        let (mut a, mut b) = (store.open_table("a").unwrap(), store.open_table("b").unwrap());
        let mut writes = SpillWrites::default();
        writes.put(b"k2".to_vec(), b"2".to_vec());
        writes.put(b"k1".to_vec(), b"1".to_vec());
        writes.put(b"z".to_vec(), b"z".to_vec());
        a.write(&writes).unwrap();
        let mut other = SpillWrites::default();
        other.put(b"k0".to_vec(), b"b".to_vec());
        b.write(&other).unwrap();
        let mut seen = Vec::new();
        a.scan(b"k", &mut |key, value| {
            seen.push((key.to_vec(), value.to_vec()));
            true
        })
        .unwrap();
        assert_eq!(seen, vec![(b"k1".to_vec(), b"1".to_vec()), (b"k2".to_vec(), b"2".to_vec())]);
        assert_eq!(b.get(b"k1").unwrap(), None);
        let many = a.get_many(&[b"k1".to_vec(), b"k3".to_vec(), b"z".to_vec()]).unwrap();
        assert_eq!(many, vec![Some(b"1".to_vec()), None, Some(b"z".to_vec())]);
        let mut after = Vec::new();
        a.scan_range(b"k", b"k2", None, &mut |key, _| {
            after.push(key.to_vec());
            true
        })
        .unwrap();
        assert_eq!(after, vec![b"k2".to_vec()]);
        let mut below = Vec::new();
        a.scan_range(b"", b"k", Some(b"k2"), &mut |key, _| {
            below.push(key.to_vec());
            true
        })
        .unwrap();
        assert_eq!(below, vec![b"k1".to_vec()], "the scan ends before its end, whatever the visitor says");
        drop(a);
        let c = store.open_table("c").unwrap();
        assert_eq!(c.get(b"k1").unwrap(), None);
        assert_eq!(b.get(b"k0").unwrap(), Some(b"b".to_vec()));
        let dir = store.opened().unwrap().dir.path().to_path_buf();
        assert!(dir.starts_with(base.path()) && dir.exists());
        drop((b, c, store));
        assert!(!dir.exists(), "the store's directory goes with it");
    }

    #[test]
    fn a_prefix_ends_before_its_successor() {
        assert_eq!(successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(successor(&[1, 0xff, 0xff]), Some(vec![2]));
        assert_eq!(successor(&[0xff, 0xff]), None);
        assert_eq!(successor(b""), None);
    }

    /// The options RocksDB recorded for the family the tables live in.
    fn family_options(dir: &Path) -> String {
        let file = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with("OPTIONS-"))
            .max()
            .expect("an OPTIONS file");
        let text = std::fs::read_to_string(file).unwrap();
        let start = text.find("[CFOptions \"default\"]").expect("the default family's options");
        text[start..].to_string()
    }

    #[test]
    fn the_tables_family_has_the_stores_options_not_rocksdbs_defaults() {
        let base = tempfile::tempdir().unwrap();
        let store = RocksStateStore::new(base.path());
        let _table = store.open_table("a").unwrap();
        let options = family_options(store.opened().unwrap().dir.path());
        for setting in [
            "compression=kNoCompression".to_string(),
            format!("write_buffer_size={WRITE_BUFFER_BYTES}"),
            "max_write_buffer_number=2".to_string(),
            "cache_index_and_filter_blocks=true".to_string(),
        ] {
            assert!(options.lines().any(|line| line.trim() == setting), "{setting} not in:\n{options}");
        }
        assert!(options.contains("filter_policy=bloomfilter"), "no bloom filter in:\n{options}");
    }

    #[test]
    fn blobs_are_files_apart_from_the_database_and_gone_with_their_set() {
        let base = tempfile::tempdir().unwrap();
        let store = RocksStateStore::new(base.path());
        let (mut a, mut b) = (store.open_blobs("w-0").unwrap(), store.open_blobs("w-1").unwrap());
        a.put(0, b"slice zero").unwrap();
        a.put(7, b"slice seven").unwrap();
        b.put(0, b"other").unwrap();
        assert_eq!(a.get(0).unwrap().as_deref(), Some(&b"slice zero"[..]));
        assert_eq!(a.get(1).unwrap(), None);
        a.remove(0).unwrap();
        assert_eq!(a.get(0).unwrap(), None);
        assert!(a.remove(0).is_err(), "removing a blob twice is an error");
        let dir = store.blobs_dir.get().unwrap().as_ref().unwrap().path().to_path_buf();
        assert!(dir.starts_with(base.path()) && dir.join("w-0").exists());
        assert!(store.opened.get().is_none(), "blobs open no database");
        drop(a);
        assert!(!dir.join("w-0").exists(), "a set's files go with it");
        assert_eq!(b.get(0).unwrap().as_deref(), Some(&b"other"[..]));
        drop((b, store));
        assert!(!dir.exists(), "the blobs' directory goes with the store");
    }
}
