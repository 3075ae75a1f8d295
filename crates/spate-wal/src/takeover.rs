//! Opening a log under a writer fence: refusing a directory a later epoch
//! wrote to, sealing the earlier epochs' segments, repairing the own
//! epoch's torn tail, and making every file owner-only.
//!
//! A writer of epoch `E` never appends to, truncates or recycles a segment
//! of another epoch: a stale writer may still be appending to it. Instead,
//! on its first open it records in `seal-e<E>` (see [`crate::seal`]) how
//! far each earlier-epoch segment holds valid records, and reads them only
//! that far. Which length a segment gets:
//!
//! - one listed in the newest earlier seal, of an epoch before that seal's:
//!   the length sealed there (a stale writer's later bytes stay outside);
//!   one such seal does not list is left out (it was created after that
//!   takeover);
//! - any other earlier-epoch segment: its length now, and for the last
//!   segment of each epoch (the one its writer was appending to) the end
//!   of its last whole record, found by a scan, as recovery does for the
//!   last segment of an unfenced log. Bytes a stale writer lands before
//!   the seal is written are part of the log; bytes it lands after never are.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::error::WalError;
use crate::files::FileLayer;
use crate::reader::valid_len;
use crate::seal::{Seal, parse_seal_name, parse_seal_temp_name, read_seal, seal_name, write_seal};
use crate::segment::{Segment, parse_segment_name};
use crate::settings::WalSettings;
use crate::spares::parse_spare_name;

/// The epoch of the writer that wrote a file of the log, or `None` for a
/// file that is not the log's.
pub(crate) fn file_epoch(name: &str) -> Option<u64> {
    parse_segment_name(name)
        .map(|id| id.epoch)
        .or_else(|| parse_seal_name(name))
        .or_else(|| parse_seal_temp_name(name))
        .or_else(|| parse_spare_name(name).map(|(epoch, _)| epoch))
}

/// Refuses a directory that holds a file of an epoch later than `epoch`.
pub(crate) fn refuse_later_epochs(dir: &Path, names: &[String], epoch: u64) -> Result<(), WalError> {
    let later = names.iter().filter_map(|name| Some((file_epoch(name)?, name))).max_by_key(|(found, _)| *found);
    match later {
        Some((found, name)) if found > epoch => {
            Err(WalError::NewerEpoch { dir: dir.to_path_buf(), file: name.clone(), found, ours: epoch })
        }
        _ => Ok(()),
    }
}

/// A [`WalError::Fenced`] unless `options`' fence still holds.
pub(crate) fn check_fence(dir: &Path, options: &WalSettings, op: &'static str) -> Result<(), WalError> {
    options.fence.check().map_err(|reason| {
        tracing::error!(dir = %dir.display(), epoch = options.fence.epoch(), op, %reason,
            "the writer fence refused a write-ahead log operation; the log refuses every later change");
        WalError::Fenced { dir: dir.to_path_buf(), epoch: options.fence.epoch(), op, reason }
    })
}

/// Clears group and other permission bits of `path`, saying so.
pub(crate) fn restrict(files: &dyn FileLayer, path: &Path, allowed: u32) -> Result<(), WalError> {
    let changed = match files.restrict_mode(path, allowed) {
        Ok(changed) => changed,
        // Deleted since it was listed (a stale writer cleaning).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(WalError::Io { op: "chmod", path: path.to_path_buf(), source: e }),
    };
    if let Some(old) = changed {
        tracing::info!(path = %path.display(), old_mode = format_args!("{old:o}"), new_mode = format_args!("{:o}", old & allowed),
            "tightened the permissions of a write-ahead log file: only its owner may read it");
    }
    Ok(())
}

/// Makes the log's files in `dir` owner-only.
#[cfg(unix)]
pub(crate) fn restrict_files(files: &dyn FileLayer, dir: &Path, names: &[String]) -> Result<(), WalError> {
    restrict(files, dir, crate::files::DIR_MODE)?;
    for name in names.iter().filter(|name| file_epoch(name).is_some()) {
        restrict(files, &dir.join(name), crate::files::FILE_MODE)?;
    }
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn restrict_files(_files: &dyn FileLayer, _dir: &Path, _names: &[String]) -> Result<(), WalError> {
    Ok(())
}

/// The segments among `names`, oldest first, each readable as far as this
/// writer may read it: its own epoch's in full (the last one cut after
/// its last whole record), earlier epochs' as far as the seal says.
pub(crate) fn open_segments(
    files: &dyn FileLayer,
    dir: &Path,
    names: &[String],
    options: &WalSettings,
) -> Result<Vec<Arc<Segment>>, WalError> {
    let epoch = options.fence.epoch();
    let segments = list_segments(files, dir, names)?;
    if epoch > 0 {
        let seal = own_seal(files, dir, names, &segments, options)?;
        for segment in segments.iter().filter(|s| s.epoch < epoch) {
            let sealed = seal.segments.get(&segment.name).map_or(0, |&len| len.min(segment.readable_len()));
            segment.cut_to(sealed);
        }
        remove_obsolete_seals(files, dir, names, epoch);
    }
    if let Some(last) = segments.iter().rev().find(|s| s.epoch == epoch) {
        repair_tail(files, dir, last, options)?;
    }
    Ok(segments)
}

/// The segments among the files `names` of `dir`, oldest first, with their
/// current lengths.
fn list_segments(files: &dyn FileLayer, dir: &Path, names: &[String]) -> Result<Vec<Arc<Segment>>, WalError> {
    let mut segments = Vec::new();
    for name in names {
        let Some(id) = parse_segment_name(name) else {
            tracing::debug!(dir = %dir.display(), file = %name, "not a segment");
            continue;
        };
        let path = dir.join(name);
        let len = match files.len(&path) {
            Ok(len) => len,
            // Deleted since it was listed (a stale writer cleaning).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(WalError::Io { op: "stat", path, source: e }),
        };
        segments.push(Arc::new(Segment::new(name.clone(), path, id, len)));
    }
    segments.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    Ok(segments)
}

/// This writer's seal: read back when it wrote one already, else made
/// from what the directory holds now and written before anything else.
fn own_seal(
    files: &dyn FileLayer,
    dir: &Path,
    names: &[String],
    segments: &[Arc<Segment>],
    options: &WalSettings,
) -> Result<Seal, WalError> {
    let epoch = options.fence.epoch();
    if names.iter().any(|name| parse_seal_name(name) == Some(epoch)) {
        return read_seal(files, &dir.join(seal_name(epoch)));
    }
    let previous = match names.iter().filter_map(|name| parse_seal_name(name)).filter(|&e| e < epoch).max() {
        Some(previous) => Some(read_seal(files, &dir.join(seal_name(previous)))?),
        None => None,
    };
    let mut seal = Seal { epoch, segments: Default::default() };
    let last_of_epoch: HashMap<u64, &str> = segments.iter().map(|s| (s.epoch, s.name.as_str())).collect();
    for segment in segments.iter().filter(|s| s.epoch < epoch) {
        let len = match &previous {
            Some(previous) if segment.epoch < previous.epoch => previous.segments.get(&segment.name).copied(),
            _ if last_of_epoch.get(&segment.epoch) == Some(&segment.name.as_str()) => {
                match valid_len(files, segment, segment.readable_len(), options) {
                    Ok(len) => Some(len),
                    // Deleted since it was listed (a stale writer cleaning): nothing to read.
                    Err(WalError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(e),
                }
            }
            _ => Some(segment.readable_len()),
        };
        if let Some(len) = len {
            seal.segments.insert(segment.name.clone(), len);
        }
    }
    check_fence(dir, options, "seal")?;
    let path = write_seal(files, dir, &seal)?;
    tracing::info!(seal = %path.display(), epoch, segments = seal.segments.len(),
        "sealed the segments of earlier writers of the write-ahead log");
    Ok(seal)
}

/// Deletes the seals of earlier epochs (ours supersedes them) and leftover
/// temporary seals; a failure only leaves a file the next open deletes.
fn remove_obsolete_seals(files: &dyn FileLayer, dir: &Path, names: &[String], epoch: u64) {
    for name in names {
        let obsolete = parse_seal_name(name).or_else(|| parse_seal_temp_name(name)).is_some_and(|e| e < epoch);
        if obsolete && let Err(e) = files.remove(&dir.join(name)) {
            tracing::warn!(dir = %dir.display(), file = %name, error = %e, "could not delete an obsolete seal");
        }
    }
}

/// Cuts a torn record off the end of this writer's own last segment.
fn repair_tail(files: &dyn FileLayer, dir: &Path, segment: &Segment, options: &WalSettings) -> Result<(), WalError> {
    let len = segment.readable_len();
    let valid = valid_len(files, segment, len, options)?;
    if valid < len {
        check_fence(dir, options, "truncate")?;
        tracing::warn!(segment = %segment.path.display(), offset = valid, dropped_bytes = len - valid,
            "cutting off a torn record at the end of the last segment");
        files.truncate(&segment.path, valid).map_err(WalError::io("truncate", &segment.path))?;
        segment.cut_to(valid);
    }
    Ok(())
}
