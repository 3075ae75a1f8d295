//! Recycled segment files ("spares"): cleaning keeps up to
//! [`crate::WalOptions::recycled_segments`] old segment files, zeroed, and
//! new segments are started in them instead of in new files.
//!
//! Writing over blocks a file already owns is much faster than writing new
//! ones on storage that allocates on first write: thin-provisioned virtual
//! disks, and file systems mounted with `discard`, where a deleted file's
//! blocks are handed back to the device. Databases recycle their logs for
//! the same reason.
//!
//! A spare is zeroed in place (`FALLOC_FL_ZERO_RANGE`: its blocks stay
//! allocated and read as zeros), so a segment started in one holds zeros
//! after its last record, never records of an earlier life. Recovery reads
//! zeros after the last record as the end of a torn tail, and sealing a
//! recycled segment cuts them off. Where a file cannot be zeroed, it is
//! deleted as before.

use std::path::{Path, PathBuf};

use crate::file_log::lock;
use crate::files::FileLayer;

/// The file name prefix of spares; no segment name starts with it.
const SPARE_PREFIX: &str = "spare-";

/// The zeroed spare files of one log directory.
#[derive(Debug)]
pub(crate) struct Spares {
    dir: PathBuf,
    /// Spares kept at most.
    limit: usize,
    state: std::sync::Mutex<SpareState>,
}

#[derive(Debug, Default)]
struct SpareState {
    /// Zeroed spares, ready to be taken.
    ready: Vec<PathBuf>,
    /// Spares being zeroed now: they count against the limit.
    preparing: usize,
    /// The number in the next spare's name.
    next: u64,
}

impl Spares {
    /// The spares found in `dir`, zeroed again (a crash may have come
    /// between a spare's rename and its zeroing), beyond `limit` deleted.
    pub(crate) fn open(files: &dyn FileLayer, dir: &Path, names: &[String], limit: usize) -> Self {
        let mut state = SpareState::default();
        for name in names {
            let Some(number) = name.strip_prefix(SPARE_PREFIX).and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            state.next = state.next.max(number + 1);
            let path = dir.join(name);
            if state.ready.len() < limit && zero(files, &path) {
                state.ready.push(path);
            } else {
                remove(files, &path);
            }
        }
        Spares { dir: dir.to_path_buf(), limit, state: std::sync::Mutex::new(state) }
    }

    /// Keeps the file of a cleaned segment as a spare when there is room
    /// and it can be zeroed; deletes it otherwise.
    pub(crate) fn retire(&self, files: &dyn FileLayer, path: &Path) -> std::io::Result<()> {
        let Some(spare) = self.reserve() else {
            return files.remove(path);
        };
        let kept = self.recycle(files, path, &spare);
        let mut state = lock(&self.state);
        state.preparing -= 1;
        if kept {
            tracing::debug!(segment = %path.display(), spare = %spare.display(), "recycled segment");
            state.ready.push(spare);
        }
        Ok(())
    }

    /// Renames the file at `path` to `spare` and zeroes it; on failure
    /// deletes whichever of the two exists.
    fn recycle(&self, files: &dyn FileLayer, path: &Path, spare: &Path) -> bool {
        // Renamed (durably) before it is zeroed: a spare is zeroed again on
        // open, but a segment file is never left zeroed under its own name.
        if let Err(e) = files.rename(path, spare).and_then(|()| files.sync_dir(&self.dir)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(segment = %path.display(), error = %e, "could not recycle a segment; deleting it");
            }
            remove(files, spare);
            remove(files, path);
            return false;
        }
        if zero(files, spare) {
            return true;
        }
        remove(files, spare);
        false
    }

    /// Moves a zeroed spare to `path` (a new segment); false when there is
    /// none, or it could not be moved (then the segment is a new file).
    pub(crate) fn take_as(&self, files: &dyn FileLayer, path: &Path) -> bool {
        let Some(spare) = lock(&self.state).ready.pop() else {
            return false;
        };
        match files.rename(&spare, path) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(spare = %spare.display(), error = %e, "could not use a spare segment file");
                remove(files, &spare);
                false
            }
        }
    }

    /// A name for a new spare, when one more fits under the limit.
    fn reserve(&self) -> Option<PathBuf> {
        let mut state = lock(&self.state);
        if state.ready.len() + state.preparing >= self.limit {
            return None;
        }
        state.preparing += 1;
        let number = state.next;
        state.next += 1;
        Some(self.dir.join(format!("{SPARE_PREFIX}{number}")))
    }
}

/// Zeroes `path`; false (with the reason logged) when it cannot be.
fn zero(files: &dyn FileLayer, path: &Path) -> bool {
    match files.zero(path) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(file = %path.display(), error = %e, "cannot zero a file in place; not recycling it");
            false
        }
    }
}

/// Deletes `path`, logging a failure (a leftover spare is deleted or reused
/// on the next open).
fn remove(files: &dyn FileLayer, path: &Path) {
    if let Err(e) = files.remove(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(file = %path.display(), error = %e, "could not delete a spare segment file");
    }
}
