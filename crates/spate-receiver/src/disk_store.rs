//! The disk store behind the block manager: a RocksDB spill area for this
//! process only.
//!
//! RocksDB is most of a cold build, so it sits behind the `disk-store`
//! feature (on by default). Without it, a block manager configured with a
//! disk directory is refused at open with [`ReceiverError::DiskStore`],
//! saying which feature is missing; memory-only levels work as before.
//!
//! The spill area is wiped whenever it is opened, so it only ever wipes a
//! directory it made itself: one it created, or found empty, and marked
//! with a `SPATE_BLOCK_SPILL_AREA` file. A non-empty directory without the marker is
//! refused ([`ReceiverError::DiskDirNotOurs`]). The directory is owner-only
//! (0700): spilled blocks are received data.

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
    /// Opens the spill area at `path`, wiping what an earlier run left.
    ///
    /// Only a directory this store made is ever wiped: see [`claim_dir`].
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
        if claim_dir(path)? == Claimed::Ours {
            // Blocks from an earlier run are not needed: recovery reads the WAL.
            rocksdb::DB::destroy(&options, path).map_err(|e| err("destroy", e))?;
            // The wipe may take the directory (and its marker) with it.
            claim_dir(path)?;
        }
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

#[cfg(feature = "disk-store")]
/// The file that marks a directory as a spill area this store made: only
/// such a directory is wiped.
pub(crate) const MARKER_FILE: &str = "SPATE_BLOCK_SPILL_AREA";

#[cfg(feature = "disk-store")]
/// What [`claim_dir`] found.
#[derive(Debug, PartialEq, Eq)]
enum Claimed {
    /// The directory was missing or empty; it is marked as ours now.
    New,
    /// The directory carries the marker: an earlier run's spill area.
    Ours,
}

#[cfg(feature = "disk-store")]
/// Makes `path` a spill-area directory this store may wipe, owner-only
/// (0700): creates it when missing, marks it when empty, and refuses a
/// non-empty directory without the marker, whose files are someone
/// else's (a wrong path must never cost a user their data).
fn claim_dir(path: &Path) -> Result<Claimed, ReceiverError> {
    let io = |op: &'static str| {
        move |e: std::io::Error| ReceiverError::DiskStore {
            path: path.to_path_buf(),
            op,
            block_id: None,
            reason: e.to_string(),
        }
    };
    let marker = path.join(MARKER_FILE);
    let found = match std::fs::read_dir(path) {
        Ok(entries) => Some(entries.filter_map(Result::ok).map(|e| e.file_name()).collect::<Vec<_>>()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("list the spill directory")(e)),
    };
    let claimed = match found {
        None => {
            create_private_dir(path).map_err(io("create the spill directory"))?;
            Claimed::New
        }
        Some(names) if names.iter().any(|n| n == MARKER_FILE) => Claimed::Ours,
        Some(names) if names.is_empty() => Claimed::New,
        Some(names) => {
            return Err(ReceiverError::DiskDirNotOurs {
                path: path.to_path_buf(),
                entries: names.len(),
                marker: MARKER_FILE,
            });
        }
    };
    make_private(path).map_err(io("make the spill directory owner-only"))?;
    if claimed == Claimed::New {
        std::fs::write(&marker, b"spate block manager spill area: wiped whenever a block manager opens it\n")
            .map_err(io("mark the spill directory"))?;
    }
    Ok(claimed)
}

#[cfg(feature = "disk-store")]
#[cfg(unix)]
fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
}

#[cfg(feature = "disk-store")]
#[cfg(not(unix))]
fn create_private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(path)
}

#[cfg(feature = "disk-store")]
/// Tightens the directory to 0700, saying so when it was wider.
#[cfg(unix)]
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
    if mode != 0o700 {
        tracing::info!(path = %path.display(), mode = format!("{mode:o}"), "spill directory made owner-only (0700)");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(feature = "disk-store")]
#[cfg(not(unix))]
fn make_private(_path: &Path) -> std::io::Result<()> {
    Ok(())
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
