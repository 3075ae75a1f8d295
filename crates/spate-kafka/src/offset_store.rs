//! The transactional offset store: a batch's results and its offsets in one
//! RocksDB write batch.
//!
//! Spark users who need exactly-once outputs store offsets "in the same
//! transaction as the results" by hand. [`RocksOffsetStore::commit_batch`]
//! does it: the results the sink writes and the ends of the batch's ranges go
//! into one synced write batch, so either both are there or neither. The
//! stream then starts from the store's offsets (see
//! [`crate::OffsetCommit::TransactionalStore`]), not the checkpoint's, so a
//! lost checkpoint directory or completely changed code neither loses nor
//! repeats a record in this store. A batch whose ranges the store has
//! already passed (a re-run after a crash) is recognised and not applied twice.

use std::path::{Path, PathBuf};

use rocksdb::{ColumnFamilyDescriptor, DB, IteratorMode, Options, WriteBatch, WriteOptions};
use spate_core::BatchId;
use tracing::{info, warn};

use crate::error::{KafkaError, Result};
use crate::offsets::{OffsetRanges, PartitionOffsets, TopicPartition};

const OFFSETS_CF: &str = "spate_offsets";
const RESULTS_CF: &str = "results";
const LAST_BATCH_KEY: &[u8] = b"\0last_batch";

/// What [`RocksOffsetStore::commit_batch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The results and offsets were written together.
    Committed,
    /// The store had already passed these ranges (a re-run): nothing was written.
    AlreadyCommitted,
}

/// The writes of one batch's results, applied with its offsets.
#[derive(Default)]
pub struct ResultWrites {
    puts: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl std::fmt::Debug for ResultWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultWrites").field("writes", &self.puts.len()).finish()
    }
}

impl ResultWrites {
    /// Sets `key` to `value`.
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.puts.push((key.into(), Some(value.into())));
    }

    /// Removes `key`.
    pub fn delete(&mut self, key: impl Into<Vec<u8>>) {
        self.puts.push((key.into(), None));
    }
}

/// A RocksDB database holding a sink's results and the offsets they cover.
pub struct RocksOffsetStore {
    db: DB,
    path: PathBuf,
}

impl std::fmt::Debug for RocksOffsetStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksOffsetStore").field("path", &self.path).finish()
    }
}

impl RocksOffsetStore {
    /// Opens (creating it) the store in `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        let families = [OFFSETS_CF, RESULTS_CF].map(|name| ColumnFamilyDescriptor::new(name, Options::default()));
        let db = DB::open_cf_descriptors(&options, &path, families).map_err(|e| store_error(&path, "open", e))?;
        Ok(RocksOffsetStore { db, path })
    }

    /// The folder of the store.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The offsets the results cover (where the stream goes on), or `None`
    /// for an empty store.
    pub fn offsets(&self) -> Result<Option<PartitionOffsets>> {
        let cf = self.cf(OFFSETS_CF)?;
        let mut offsets = PartitionOffsets::new();
        for entry in self.db.iterator_cf(cf, IteratorMode::Start) {
            let (key, value) = entry.map_err(|e| store_error(&self.path, "read offsets", e))?;
            if key.as_ref() == LAST_BATCH_KEY {
                continue;
            }
            let tp = decode_partition(&key).ok_or_else(|| self.corrupt("offset key", &key))?;
            // Read from disk: an offset no partition can have is corruption, not a start.
            let offset = decode_i64(&value)
                .filter(|o| *o >= 0)
                .ok_or_else(|| self.corrupt(&format!("offset of {tp}"), &value))?;
            offsets.insert(tp, offset);
        }
        Ok(if offsets.is_empty() { None } else { Some(offsets) })
    }

    /// The id of the last batch committed (as the writer numbered it).
    pub fn last_batch(&self) -> Result<Option<BatchId>> {
        let cf = self.cf(OFFSETS_CF)?;
        let value = self.db.get_cf(cf, LAST_BATCH_KEY).map_err(|e| store_error(&self.path, "read last batch", e))?;
        value
            .map(|v| {
                let id = decode_i64(&v).and_then(|b| u64::try_from(b).ok());
                id.map(BatchId).ok_or_else(|| self.corrupt("last batch", &v))
            })
            .transpose()
    }

    /// Writes the batch's results (filled in by `write`) and the ends of its
    /// `ranges` in one synced write batch. When the store is already at or
    /// past every range's end, the batch was applied before (a re-run) and
    /// nothing is written; a range that starts past the stored offset (a gap)
    /// is refused.
    pub fn commit_batch(
        &self,
        batch: BatchId,
        ranges: &OffsetRanges,
        write: impl FnOnce(&mut ResultWrites) -> Result<()>,
    ) -> Result<CommitOutcome> {
        // Stored as a signed 64-bit number: a larger id would come back negative.
        let batch_value = i64::try_from(batch.0).map_err(|_| KafkaError::Store {
            path: self.path.clone(),
            reason: format!("batch id {batch} is larger than the store can hold ({})", i64::MAX),
        })?;
        for range in ranges.ranges() {
            range
                .checked_count()
                .map_err(|reason| KafkaError::BadRange { partition: range.topic_partition(), reason })?;
        }
        let stored = self.offsets()?.unwrap_or_default();
        let non_empty: Vec<_> = ranges.ranges().iter().filter(|r| r.count() > 0).collect();
        if !non_empty.is_empty() && non_empty.iter().all(|r| stored.get(&r.topic_partition()) >= Some(&r.until)) {
            info!(batch = batch.0, "batch already in the offset store; not applied again");
            return Ok(CommitOutcome::AlreadyCommitted);
        }
        for range in &non_empty {
            let at = stored.get(&range.topic_partition()).copied();
            if at.is_some_and(|at| at != range.from) {
                warn!(range = %range, stored = ?at, "range does not continue the offset store");
                return Err(KafkaError::Store {
                    path: self.path.clone(),
                    reason: format!(
                        "batch {} range {range} does not start where the store is ({at:?}): \
                         start the stream from the store's offsets",
                        batch.0
                    ),
                });
            }
        }
        let mut writes = ResultWrites::default();
        write(&mut writes)?;
        let (offsets_cf, results_cf) = (self.cf(OFFSETS_CF)?, self.cf(RESULTS_CF)?);
        let mut wb = WriteBatch::default();
        for (key, value) in writes.puts {
            match value {
                Some(value) => wb.put_cf(results_cf, key, value),
                None => wb.delete_cf(results_cf, key),
            }
        }
        for range in ranges.ranges() {
            wb.put_cf(offsets_cf, encode_partition(&range.topic_partition()), range.until.to_be_bytes());
        }
        wb.put_cf(offsets_cf, LAST_BATCH_KEY, batch_value.to_be_bytes());
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        self.db.write_opt(wb, &sync).map_err(|e| store_error(&self.path, "commit batch", e))?;
        Ok(CommitOutcome::Committed)
    }

    /// A result value.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get_cf(self.cf(RESULTS_CF)?, key).map_err(|e| store_error(&self.path, "read result", e))
    }

    /// Every result, in key order.
    pub fn results(&self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.db
            .iterator_cf(self.cf(RESULTS_CF)?, IteratorMode::Start)
            .map(|entry| {
                entry.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(|e| store_error(&self.path, "read results", e))
            })
            .collect()
    }

    fn cf(&self, name: &str) -> Result<&rocksdb::ColumnFamily> {
        self.db.cf_handle(name).ok_or_else(|| KafkaError::Store {
            path: self.path.clone(),
            reason: format!("column family {name} is missing"),
        })
    }

    fn corrupt(&self, what: &str, bytes: &[u8]) -> KafkaError {
        KafkaError::Store { path: self.path.clone(), reason: format!("malformed {what} ({} bytes)", bytes.len()) }
    }
}

fn store_error(path: &Path, what: &str, e: rocksdb::Error) -> KafkaError {
    KafkaError::Store { path: path.to_path_buf(), reason: format!("{what}: {e}") }
}

/// `topic` NUL `partition (4 bytes, big-endian)`: topic names never hold NUL.
fn encode_partition(tp: &TopicPartition) -> Vec<u8> {
    let mut key = tp.topic.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(&tp.partition.to_be_bytes());
    key
}

fn decode_partition(key: &[u8]) -> Option<TopicPartition> {
    let split = key.len().checked_sub(5)?;
    let (topic, rest) = key.split_at(split);
    let (nul, partition) = rest.split_first()?;
    if *nul != 0 {
        return None;
    }
    let partition = i32::from_be_bytes(partition.try_into().ok()?);
    Some(TopicPartition::new(String::from_utf8(topic.to_vec()).ok()?, partition))
}

fn decode_i64(bytes: &[u8]) -> Option<i64> {
    Some(i64::from_be_bytes(bytes.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::offsets::OffsetRange;

    fn ranges(from: i64, until: i64) -> OffsetRanges {
        OffsetRanges::new(vec![OffsetRange::new("t", 0, from, until), OffsetRange::new("t", 1, from, until)])
    }

    #[test]
    fn results_and_offsets_commit_together_and_reruns_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksOffsetStore::open(dir.path()).unwrap();
        assert_eq!(store.offsets().unwrap(), None);
        let outcome = store.commit_batch(BatchId(0), &ranges(0, 5), |w| {
            w.put("count", 10u64.to_be_bytes());
            Ok(())
        });
        assert_eq!(outcome.unwrap(), CommitOutcome::Committed);
        // The same batch again (a re-run): not applied.
        let again = store.commit_batch(BatchId(0), &ranges(0, 5), |_| panic!("must not write")).unwrap();
        assert_eq!(again, CommitOutcome::AlreadyCommitted);
        // A gap is refused.
        assert!(matches!(store.commit_batch(BatchId(1), &ranges(6, 8), |_| Ok(())), Err(KafkaError::Store { .. })));
        drop(store);

        let store = RocksOffsetStore::open(dir.path()).unwrap();
        let offsets = store.offsets().unwrap().unwrap();
        assert_eq!(offsets[&TopicPartition::new("t", 0)], 5);
        assert_eq!(offsets[&TopicPartition::new("t", 1)], 5);
        assert_eq!(store.last_batch().unwrap(), Some(BatchId(0)));
        assert_eq!(store.get(b"count").unwrap(), Some(10u64.to_be_bytes().to_vec()));
    }

    #[test]
    fn a_failing_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksOffsetStore::open(dir.path()).unwrap();
        let failed = store.commit_batch(BatchId(0), &ranges(0, 5), |w| {
            w.put("k", "v");
            Err(KafkaError::Config("sink failed".into()))
        });
        assert!(failed.is_err());
        assert_eq!(store.offsets().unwrap(), None);
        assert_eq!(store.results().unwrap(), vec![]);
    }

    #[test]
    fn numbers_read_from_the_store_or_given_to_it_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksOffsetStore::open(dir.path()).unwrap();
        // Ids and ranges the store cannot hold are refused before anything is written.
        let too_big = store.commit_batch(BatchId(u64::MAX), &ranges(0, 5), |_| Ok(()));
        assert!(matches!(&too_big, Err(KafkaError::Store { reason, .. }) if reason.contains("larger")), "{too_big:?}");
        let reversed = store.commit_batch(BatchId(0), &ranges(5, 0), |_| Ok(()));
        assert!(matches!(reversed, Err(KafkaError::BadRange { .. })), "{reversed:?}");
        assert_eq!(store.offsets().unwrap(), None);

        // A negative last batch on disk would wrap to a huge id.
        let cf = store.cf(OFFSETS_CF).unwrap();
        store.db.put_cf(cf, LAST_BATCH_KEY, (-1i64).to_be_bytes()).unwrap();
        assert!(matches!(store.last_batch(), Err(KafkaError::Store { .. })));
        // A negative offset on disk would become the stream's start.
        store.db.put_cf(cf, LAST_BATCH_KEY, 0i64.to_be_bytes()).unwrap();
        store.db.put_cf(cf, encode_partition(&TopicPartition::new("t", 3)), (-7i64).to_be_bytes()).unwrap();
        match store.offsets() {
            Err(KafkaError::Store { reason, .. }) => assert!(reason.contains("t/3"), "{reason}"),
            other => panic!("expected a corrupt store, got {other:?}"),
        }
    }

    #[test]
    fn partition_keys_round_trip() {
        for tp in [TopicPartition::new("a", 0), TopicPartition::new("with.dots-and_", 123_456)] {
            assert_eq!(decode_partition(&encode_partition(&tp)), Some(tp));
        }
        assert_eq!(decode_partition(b"abc"), None);
    }
}
