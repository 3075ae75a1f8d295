//! Recycled segment files ("spares"): cleaning keeps up to
//! [`crate::WalSettings::recycled_segments`] old segment files, zeroed, and
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
//!
//! Spares belong to one writer epoch, which their names carry
//! (`spare-e<epoch>-<n>`; `spare-<n>` for epoch 0). A writer recycles only
//! segments of its own epoch and takes only its own spares: a segment of
//! an earlier epoch may still be appended to by a stale writer, and so
//! may any file that writer renames into place. Spares of earlier epochs
//! are deleted when a later writer opens the log, never reused: a stale
//! writer may be about to take one, or be between opening one and zeroing
//! it, and zeroing goes through that open file, so a file the new writer
//! adopted could still be zeroed under its records. Deleting it only
//! unlinks the name; whatever the stale writer does to it afterwards lands
//! in a file nobody reads.

use std::path::{Path, PathBuf};

use spate_core::sync::lock;

use crate::files::FileLayer;

/// The file name prefix of spares; no segment name starts with it.
const SPARE_PREFIX: &str = "spare-";

/// The file name of spare number `number` of a writer of `epoch`.
fn spare_name(epoch: u64, number: u64) -> String {
    if epoch == 0 { format!("{SPARE_PREFIX}{number}") } else { format!("{SPARE_PREFIX}e{epoch}-{number}") }
}

/// The epoch and number in a spare's file name, or `None` for any other file.
pub(crate) fn parse_spare_name(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix(SPARE_PREFIX)?;
    let (epoch, number) = match rest.strip_prefix('e') {
        Some(rest) => {
            let (epoch, number) = rest.split_once('-')?;
            (epoch.parse().ok()?, number.parse().ok()?)
        }
        None => (0, rest.parse().ok()?),
    };
    (spare_name(epoch, number) == name).then_some((epoch, number))
}

/// The zeroed spare files of one log directory.
#[derive(Debug)]
pub(crate) struct Spares {
    dir: PathBuf,
    /// The writer's epoch: the only one whose spares it uses.
    epoch: u64,
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
    /// The spares of `epoch` found in `dir`, zeroed again (a crash may
    /// have come between a spare's rename and its zeroing), beyond `limit`
    /// deleted; spares of other epochs deleted (the caller refused to open
    /// a directory with later ones).
    pub(crate) fn open(files: &dyn FileLayer, dir: &Path, names: &[String], limit: usize, epoch: u64) -> Self {
        let mut state = SpareState::default();
        for name in names {
            let Some((spare_epoch, number)) = parse_spare_name(name) else {
                continue;
            };
            let path = dir.join(name);
            if spare_epoch != epoch {
                tracing::debug!(spare = %path.display(), "deleting a spare of another epoch");
                remove(files, &path);
                continue;
            }
            state.next = state.next.max(number.saturating_add(1));
            if state.ready.len() < limit && zero(files, &path) {
                state.ready.push(path);
            } else {
                remove(files, &path);
            }
        }
        Spares { dir: dir.to_path_buf(), epoch, limit, state: std::sync::Mutex::new(state) }
    }

    /// Keeps the file of a cleaned segment of `segment_epoch` as a spare
    /// when it is of this writer's epoch, there is room and it can be
    /// zeroed; deletes it otherwise.
    pub(crate) fn retire(&self, files: &dyn FileLayer, path: &Path, segment_epoch: u64) -> std::io::Result<()> {
        if segment_epoch != self.epoch {
            return files.remove(path);
        }
        let Some(spare) = self.reserve() else {
            return files.remove(path);
        };
        let kept = self.recycle(files, path, &spare);
        let mut state = lock(&self.state);
        state.preparing -= 1;
        if kept? {
            tracing::debug!(segment = %path.display(), spare = %spare.display(), "recycled segment");
            state.ready.push(spare);
        }
        Ok(())
    }

    /// Renames the file at `path` to `spare` and zeroes it; on failure
    /// deletes whichever of the two exists. An error when the segment is
    /// still there under its own name (a spare left over is harmless: it
    /// is zeroed or deleted on the next open, never read).
    fn recycle(&self, files: &dyn FileLayer, path: &Path, spare: &Path) -> std::io::Result<bool> {
        // Renamed (durably) before it is zeroed: a spare is zeroed again on
        // open, but a segment file is never left zeroed under its own name.
        if let Err(e) = files.rename(path, spare).and_then(|()| files.sync_dir(&self.dir)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(segment = %path.display(), error = %e, "could not recycle a segment; deleting it");
            }
            remove(files, spare);
            return match files.remove(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(false),
            };
        }
        if zero(files, spare) {
            return Ok(true);
        }
        remove(files, spare);
        Ok(false)
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
        Some(self.dir.join(spare_name(self.epoch, number)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_names_carry_the_epoch_and_parse_exactly() {
        for (epoch, number) in [(0, 0), (0, 17), (3, 0), (u64::MAX, u64::MAX)] {
            assert_eq!(parse_spare_name(&spare_name(epoch, number)), Some((epoch, number)));
        }
        assert_eq!(spare_name(0, 4), "spare-4", "legacy name");
        assert_eq!(spare_name(2, 4), "spare-e2-4");
        for name in ["spare-", "spare-e", "spare-e2", "spare-e0-1", "spare-01", "spare-e2-01", "spare-x", "log-1-2"] {
            assert_eq!(parse_spare_name(name), None, "{name}");
        }
    }
}
