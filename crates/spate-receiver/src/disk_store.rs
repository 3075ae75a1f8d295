//! The disk store behind the block manager: a RocksDB spill area for this
//! process only.
//!
//! RocksDB is most of a cold build, so it sits behind the `disk-store`
//! feature (on by default). Without it, a block manager configured with a
//! disk directory is refused at open with [`ReceiverError::DiskStore`],
//! saying which feature is missing; memory-only levels work as before.

use std::path::{Path, PathBuf};

use spate_core::StreamBlockId;

use crate::error::ReceiverError;

#[cfg(feature = "disk-store")]
/// The RocksDB spill area.
pub(crate) struct DiskStore {
    db: rocksdb::DB,
    path: PathBuf,
    write_options: rocksdb::WriteOptions,
}

#[cfg(feature = "disk-store")]
impl DiskStore {
    pub(crate) fn open(path: &Path) -> Result<Self, ReceiverError> {
        let err = |op, e: rocksdb::Error| ReceiverError::DiskStore {
            path: path.to_path_buf(),
            op,
            block_id: None,
            reason: e.into_string(),
        };
        let mut options = rocksdb::Options::default();
        options.create_if_missing(true);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        // Blocks from an earlier run are not needed: recovery reads the WAL.
        rocksdb::DB::destroy(&options, path).map_err(|e| err("destroy", e))?;
        let db = rocksdb::DB::open(&options, path).map_err(|e| err("open", e))?;
        let mut write_options = rocksdb::WriteOptions::default();
        // The store is wiped on open, so RocksDB's own log buys nothing.
        write_options.disable_wal(true);
        Ok(DiskStore { db, path: path.to_path_buf(), write_options })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn key(block_id: StreamBlockId) -> [u8; 12] {
        let mut key = [0u8; 12];
        key[..4].copy_from_slice(&block_id.stream_id.0.to_be_bytes());
        key[4..].copy_from_slice(&block_id.unique_id.to_be_bytes());
        key
    }

    fn error(&self, op: &'static str, block_id: StreamBlockId, e: rocksdb::Error) -> ReceiverError {
        ReceiverError::DiskStore { path: self.path.clone(), op, block_id: Some(block_id), reason: e.into_string() }
    }

    pub(crate) fn put(&self, block_id: StreamBlockId, bytes: &[u8]) -> Result<(), ReceiverError> {
        self.db.put_opt(Self::key(block_id), bytes, &self.write_options).map_err(|e| self.error("put", block_id, e))
    }

    pub(crate) fn get(&self, block_id: StreamBlockId) -> Result<Option<Vec<u8>>, ReceiverError> {
        self.db.get(Self::key(block_id)).map_err(|e| self.error("get", block_id, e))
    }

    pub(crate) fn delete(&self, block_id: StreamBlockId) -> Result<(), ReceiverError> {
        self.db.delete_opt(Self::key(block_id), &self.write_options).map_err(|e| self.error("delete", block_id, e))
    }
}


/// Stands in for the RocksDB spill area in a build without it: it cannot
/// be opened, so no block ever reaches its methods.
#[cfg(not(feature = "disk-store"))]
pub(crate) struct DiskStore {
    path: PathBuf,
    never: std::convert::Infallible,
}

#[cfg(not(feature = "disk-store"))]
impl DiskStore {
    pub(crate) fn open(path: &Path) -> Result<Self, ReceiverError> {
        Err(ReceiverError::DiskStore {
            path: path.to_path_buf(),
            op: "open",
            block_id: None,
            reason: "this build has no disk store: build spate-receiver with the `disk-store` feature".to_string(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn put(&self, _block_id: StreamBlockId, _bytes: &[u8]) -> Result<(), ReceiverError> {
        match self.never {}
    }

    pub(crate) fn get(&self, _block_id: StreamBlockId) -> Result<Option<Vec<u8>>, ReceiverError> {
        match self.never {}
    }

    pub(crate) fn delete(&self, _block_id: StreamBlockId) -> Result<(), ReceiverError> {
        match self.never {}
    }
}
