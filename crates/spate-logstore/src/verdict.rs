//! The recovery verdict: what a restart must do with a checkpoint directory.
//!
//! With O the last id in `offsets/` and C the last id in `commits/`:
//! nothing at all is a fresh start; O == C resumes at batch C+1; O == C+1
//! re-runs batch O with exactly its logged offsets. Every other shape is
//! inconsistent and stops the restart with the files involved and the repair
//! command, because guessing loses or repeats data. The best known case is a
//! commit ahead of the offsets (`offsets/N` missing, `commits/N` present),
//! where Spark re-runs batch N-1, writes its output twice, then fails with
//! "Concurrent update to the log. Multiple streaming jobs detected".
//!
//! A consistent log is not enough: an operator state snapshot newer than
//! the last commit (see the `state` module) is inconsistent too.
//!
//! [`classify`] is the pure decision on the lists of ids; [`inspect`] adds
//! the I/O: it lists the two directories and the state snapshots, and reads
//! only the newest entries, the `metadata` file and the `graph` manifest,
//! never the whole log (and, of an inconsistent checkpoint, the header of
//! each state snapshot, for the repair).

use std::fmt;
use std::path::{Path, PathBuf};

use spate_core::BatchId;

use crate::checkpoint::{COMMITS_DIR, METADATA_FILE, OFFSETS_DIR, read_metadata};
use crate::entries::{CommitMetadata, OffsetSeq};
use crate::error::{LogStoreError, Result};
use crate::file_manager::{CheckpointFileManager, LogListing};
use crate::location::{ObjectStoreSettings, file_manager_for};
use crate::log::{MAX_LOG_FILE_BYTES, decode_entry};
use crate::state::{GRAPH_FILE, StateShape, read_state_links, read_state_shape};

/// Where a consistent checkpoint puts the next run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryPoint {
    /// Nothing logged: start from the sources' initial positions.
    Fresh,
    /// Every logged batch committed: plan batch `next` anew.
    Resume {
        /// The batch to plan next (C+1).
        next: BatchId,
    },
    /// The last batch was planned but not committed: run it again with its logged offsets.
    Rerun {
        /// The batch to run again (O).
        batch: BatchId,
    },
}

impl fmt::Display for RecoveryPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoveryPoint::Fresh => write!(f, "start fresh (nothing logged)"),
            RecoveryPoint::Resume { next } => write!(f, "resume at batch {next} (every logged batch committed)"),
            RecoveryPoint::Rerun { batch } => write!(f, "re-run batch {batch} with its logged offsets"),
        }
    }
}

/// The ids found in a checkpoint's two logs, and the files that could not be
/// read, relative to the checkpoint directory. The input of [`classify`] and
/// of repair planning.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointShape {
    /// Ids in `offsets/`, ascending.
    pub offsets: Vec<BatchId>,
    /// Ids in `commits/`, ascending.
    pub commits: Vec<BatchId>,
    /// Files that exist but cannot be read (relative paths such as `offsets/7`).
    pub unreadable: Vec<(PathBuf, String)>,
    /// The operator state snapshots, and the one `graph` names.
    pub state: StateShape,
}

/// What is wrong with an inconsistent checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InconsistencyKind {
    /// A commit exists for a batch whose offsets are missing.
    CommitAhead {
        /// The last offsets id, if any.
        last_offsets: Option<BatchId>,
        /// The last commit id (greater than `last_offsets`).
        last_commit: BatchId,
    },
    /// The offsets ids are not contiguous.
    OffsetsGap {
        /// The first missing id.
        missing: BatchId,
        /// The next id present after the gap.
        next_present: BatchId,
    },
    /// The commit ids are not contiguous.
    CommitsGap {
        /// The first missing id.
        missing: BatchId,
        /// The next id present after the gap.
        next_present: BatchId,
    },
    /// More than one batch has offsets but no commit.
    GapBetween {
        /// The last commit id (`None`: no commits).
        last_commit: Option<BatchId>,
        /// The last offsets id (more than one past the last commit).
        last_offsets: BatchId,
    },
    /// A log entry's name is a batch id no batch could follow
    /// (`18446744073709551615`), or a number too large for a batch id.
    IdOutOfRange {
        /// The file, relative to the checkpoint directory.
        file: PathBuf,
    },
    /// An operator state snapshot is newer than the last commit: restored,
    /// it would count the batches after the commit twice once they run again.
    StateAhead {
        /// The newest snapshot's batch (named by `graph`, or found in `state/`).
        state_batch: BatchId,
        /// The last commit (`None`: no commits).
        last_commit: Option<BatchId>,
    },
    /// A file needed to decide cannot be read.
    Unreadable {
        /// The file, relative to the checkpoint directory.
        file: PathBuf,
        /// Why.
        reason: String,
    },
}

impl fmt::Display for InconsistencyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InconsistencyKind::CommitAhead { last_offsets, last_commit } => write!(
                f,
                "commit ahead of offsets: commits/{last_commit} exists but the last offsets are {}; \
                 resuming would re-run a batch whose output is already written and then fail \
                 (Spark's \"Concurrent update to the log. Multiple streaming jobs detected\")",
                last_offsets.map_or("none".to_string(), |o| format!("offsets/{o}")),
            ),
            InconsistencyKind::OffsetsGap { missing, next_present } => {
                write!(f, "gap in offsets: offsets/{missing} is missing but offsets/{next_present} exists")
            }
            InconsistencyKind::CommitsGap { missing, next_present } => {
                write!(f, "gap in commits: commits/{missing} is missing but commits/{next_present} exists")
            }
            InconsistencyKind::GapBetween { last_commit, last_offsets } => write!(
                f,
                "gap between offsets and commits: offsets go up to {last_offsets} but the last commit is {}; \
                 only one batch may be planned and not committed",
                last_commit.map_or("none".to_string(), |c| c.to_string()),
            ),
            InconsistencyKind::IdOutOfRange { file } => write!(
                f,
                "batch id out of range: {} names a batch that no batch could follow (or a number too large \
                 for a batch id); spate never writes such an entry",
                file.display()
            ),
            InconsistencyKind::StateAhead { state_batch, last_commit } => write!(
                f,
                "state snapshot ahead of the commits: the operator state was taken after batch {state_batch}, \
                 but the last commit is {}; restoring it and running the batches after the commit again \
                 would count them twice",
                last_commit.map_or("none".to_string(), |c| c.to_string()),
            ),
            InconsistencyKind::Unreadable { file, reason } => {
                write!(f, "unreadable file {}: {reason}", file.display())
            }
        }
    }
}

/// An inconsistent checkpoint: what is wrong, the files involved, and how to repair it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inconsistency {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// What is wrong.
    pub kind: InconsistencyKind,
    /// The files involved, relative to `dir` (a missing one is named too).
    pub files: Vec<PathBuf>,
    /// What inspection saw; the input of [`crate::plan_repair`].
    pub shape: CheckpointShape,
}

impl Inconsistency {
    /// The command that shows the repair plan and, with `--apply`, applies it.
    pub fn repair_command(&self) -> String {
        repair_command(&self.dir)
    }
}

/// `spate checkpoint repair <dir> --apply`.
pub fn repair_command(dir: &Path) -> String {
    format!("spate checkpoint repair {} --apply", dir.display())
}

impl fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "checkpoint {} is inconsistent: {}", self.dir.display(), self.kind)?;
        let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
        if !files.is_empty() {
            write!(f, "; files involved: {}", files.join(", "))?;
        }
        write!(
            f,
            ". Nothing was changed. To see the repair plan run `spate checkpoint repair {}`; \
             to apply it (files are moved to _quarantine/, never deleted) run `{}`",
            self.dir.display(),
            self.repair_command()
        )
    }
}

/// The recovery verdict of a checkpoint directory.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Nothing logged.
    Fresh,
    /// O == C: plan batch `next` = C+1 anew.
    Resume {
        /// The batch to plan next.
        next: BatchId,
        /// The offsets of the last batch (where the next batch starts).
        last_offsets: OffsetSeq,
        /// The last commit (the watermark to start from).
        last_commit: CommitMetadata,
    },
    /// O == C+1: run batch `batch` again with exactly `offsets`.
    Rerun {
        /// The batch to run again.
        batch: BatchId,
        /// Its logged offsets.
        offsets: OffsetSeq,
        /// The commit of the batch before it, if any.
        last_commit: Option<CommitMetadata>,
    },
    /// Any other shape: stop and repair.
    Inconsistent(Box<Inconsistency>),
}

impl Verdict {
    /// The recovery point, or `None` when inconsistent.
    pub fn recovery_point(&self) -> Option<RecoveryPoint> {
        match self {
            Verdict::Fresh => Some(RecoveryPoint::Fresh),
            Verdict::Resume { next, .. } => Some(RecoveryPoint::Resume { next: *next }),
            Verdict::Rerun { batch, .. } => Some(RecoveryPoint::Rerun { batch: *batch }),
            Verdict::Inconsistent(_) => None,
        }
    }

    /// The verdict itself when consistent, [`LogStoreError::Inconsistent`] otherwise:
    /// what a restart calls to refuse an inconsistent directory.
    pub fn into_consistent(self) -> Result<Verdict> {
        match self {
            Verdict::Inconsistent(inconsistency) => Err(LogStoreError::Inconsistent(inconsistency)),
            consistent => Ok(consistent),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.recovery_point(), self) {
            (_, Verdict::Inconsistent(inconsistency)) => inconsistency.fmt(f),
            (Some(point), _) => point.fmt(f),
            (None, _) => Ok(()),
        }
    }
}

/// The first hole in an ascending list of ids: (first missing, next present).
fn first_gap(ids: &[BatchId]) -> Option<(BatchId, BatchId)> {
    ids.windows(2).find_map(|w| match w[0].next() {
        Some(next) if next != w[1] => Some((next, w[1])),
        _ => None,
    })
}

/// The first id (of offsets, then commits) that no batch could follow.
fn out_of_range(offsets: &[BatchId], commits: &[BatchId]) -> Option<InconsistencyKind> {
    [(OFFSETS_DIR, offsets), (COMMITS_DIR, commits)].into_iter().find_map(|(dir, ids)| {
        let id = ids.iter().find(|id| id.next().is_none())?;
        Some(InconsistencyKind::IdOutOfRange { file: Path::new(dir).join(id.0.to_string()) })
    })
}

/// The pure decision on the ids of the two logs (ascending). An id without
/// a successor (`u64::MAX`) is an inconsistency, never a batch to resume
/// after.
pub fn classify(offsets: &[BatchId], commits: &[BatchId]) -> Result<RecoveryPoint, InconsistencyKind> {
    if let Some(kind) = out_of_range(offsets, commits) {
        return Err(kind);
    }
    let (last_offsets, last_commit) = (offsets.last().copied(), commits.last().copied());
    if let Some(c) = last_commit
        && last_offsets.is_none_or(|o| c > o)
    {
        return Err(InconsistencyKind::CommitAhead { last_offsets, last_commit: c });
    }
    if let Some((missing, next_present)) = first_gap(offsets) {
        return Err(InconsistencyKind::OffsetsGap { missing, next_present });
    }
    if let Some((missing, next_present)) = first_gap(commits) {
        return Err(InconsistencyKind::CommitsGap { missing, next_present });
    }
    let (Some(o), Some(first_offsets)) = (last_offsets, offsets.first().copied()) else {
        return Ok(RecoveryPoint::Fresh);
    };
    match (last_commit, o.next()) {
        (Some(c), Some(next)) if c == o => Ok(RecoveryPoint::Resume { next }),
        (Some(c), _) if c.next() == Some(o) => Ok(RecoveryPoint::Rerun { batch: o }),
        // No commits: the retained offsets must be a single pending batch
        // (batch 0, or the first after a purge).
        (None, _) if first_offsets == o => Ok(RecoveryPoint::Rerun { batch: o }),
        _ => Err(InconsistencyKind::GapBetween { last_commit, last_offsets: o }),
    }
}

/// The files (relative to the checkpoint) an inconsistency involves.
pub(crate) fn files_involved(kind: &InconsistencyKind, shape: &CheckpointShape) -> Vec<PathBuf> {
    let offsets = |id: BatchId| Path::new(OFFSETS_DIR).join(id.0.to_string());
    let commits = |id: BatchId| Path::new(COMMITS_DIR).join(id.0.to_string());
    match kind {
        InconsistencyKind::CommitAhead { last_offsets, .. } => {
            let above = |id: &&BatchId| last_offsets.is_none_or(|o| **id > o);
            let mut files: Vec<PathBuf> = shape.commits.iter().filter(above).map(|id| commits(*id)).collect();
            if let Some(missing) = last_offsets.map_or(Some(BatchId(0)), BatchId::next) {
                files.insert(0, offsets(missing));
            }
            files
        }
        InconsistencyKind::OffsetsGap { missing, .. } => {
            let mut files = vec![offsets(*missing)];
            files.extend(shape.offsets.iter().filter(|id| *id > missing).map(|id| offsets(*id)));
            files.extend(shape.commits.iter().filter(|id| *id >= missing).map(|id| commits(*id)));
            files
        }
        InconsistencyKind::CommitsGap { missing, .. } => {
            let mut files = vec![commits(*missing)];
            files.extend(shape.commits.iter().filter(|id| *id > missing).map(|id| commits(*id)));
            files
        }
        InconsistencyKind::GapBetween { last_commit, .. } => {
            let pending = |id: &&BatchId| last_commit.is_none_or(|c| **id > c);
            shape.offsets.iter().filter(pending).map(|id| offsets(*id)).collect()
        }
        InconsistencyKind::StateAhead { last_commit, .. } => {
            let mut files = shape.state.files_after(*last_commit);
            if shape.state.named.is_some_and(|named| last_commit.is_none_or(|c| named > c)) {
                files.insert(0, PathBuf::from(GRAPH_FILE));
            }
            files
        }
        InconsistencyKind::IdOutOfRange { file } | InconsistencyKind::Unreadable { file, .. } => vec![file.clone()],
    }
}

/// The verdict of the checkpoint at `dir` (a path, or `s3://bucket/prefix`
/// reached with the AWS environment variables).
pub fn inspect(dir: &Path) -> Result<Verdict> {
    inspect_with(file_manager_for(dir, &ObjectStoreSettings::default())?.as_ref(), dir)
}

/// [`inspect`] through any file manager. Lists `offsets/` and `commits/`
/// and reads only `metadata`, the last offsets and the last commit.
pub fn inspect_with(files: &dyn CheckpointFileManager, dir: &Path) -> Result<Verdict> {
    if !files.exists(dir)? {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such checkpoint directory");
        return Err(LogStoreError::io("inspect", dir, missing));
    }
    let ids = |sub: &str| -> Result<LogListing> {
        let mut listing = files.list_log(&dir.join(sub))?;
        listing.ids.sort_unstable();
        Ok(listing)
    };
    // Listing the two logs is nearly all the work on a long log: do both at once.
    let (offsets, commits) = std::thread::scope(|scope| {
        let commits = scope.spawn(|| ids(COMMITS_DIR));
        (ids(OFFSETS_DIR), commits.join())
    });
    let commits = commits.unwrap_or_else(|_| {
        Err(LogStoreError::io("list", dir.join(COMMITS_DIR), std::io::Error::other("listing thread panicked")))
    });
    let (offsets, commits) = (offsets?, commits?);
    let mut shape = CheckpointShape { offsets: offsets.ids, commits: commits.ids, ..CheckpointShape::default() };
    let inconsistent = |kind: InconsistencyKind, mut shape: CheckpointShape| {
        // A repair may point `graph` at an older snapshot: it needs each file's link.
        read_state_links(files, dir, &mut shape.state);
        let files = files_involved(&kind, &shape);
        Ok(Verdict::Inconsistent(Box::new(Inconsistency { dir: dir.to_path_buf(), kind, files, shape })))
    };
    // Names too large for an id are listed as unreadable so a repair moves them aside.
    let too_large: Vec<PathBuf> = [(OFFSETS_DIR, offsets.too_large), (COMMITS_DIR, commits.too_large)]
        .into_iter()
        .flat_map(|(sub, names)| names.into_iter().map(move |name| Path::new(sub).join(name)))
        .collect();
    if let Some(first) = too_large.first().cloned() {
        let reason = "the name is a number too large for a batch id".to_string();
        shape.unreadable.extend(too_large.into_iter().map(|file| (file, reason.clone())));
        return inconsistent(InconsistencyKind::IdOutOfRange { file: first }, shape);
    }
    match read_state_shape(files, dir) {
        Ok(state) => shape.state = state,
        Err((file, reason)) => {
            shape.unreadable.push((file.clone(), reason.clone()));
            return inconsistent(InconsistencyKind::Unreadable { file, reason }, shape);
        }
    }
    if let Err(unreadable) = read_metadata(files, dir) {
        shape.unreadable.push((PathBuf::from(METADATA_FILE), unreadable.to_string()));
        let kind = InconsistencyKind::Unreadable { file: PathBuf::from(METADATA_FILE), reason: unreadable.to_string() };
        return inconsistent(kind, shape);
    }
    let point = match classify(&shape.offsets, &shape.commits) {
        Ok(point) => point,
        Err(kind) => return inconsistent(kind, shape),
    };
    let last_commit = shape.commits.last().copied();
    if let Some(state_batch) = shape.state.newest_after(last_commit) {
        return inconsistent(InconsistencyKind::StateAhead { state_batch, last_commit }, shape);
    }
    let last_offsets = read_last::<OffsetSeq>(files, dir, OFFSETS_DIR, shape.offsets.last().copied());
    let last_commit = read_last::<CommitMetadata>(files, dir, COMMITS_DIR, shape.commits.last().copied());
    match (point, last_offsets, last_commit) {
        (_, Err((file, reason)), _) | (_, _, Err((file, reason))) => {
            shape.unreadable.push((file.clone(), reason.clone()));
            inconsistent(InconsistencyKind::Unreadable { file, reason }, shape)
        }
        (RecoveryPoint::Fresh, _, _) => Ok(Verdict::Fresh),
        (RecoveryPoint::Resume { next }, Ok(Some(last_offsets)), Ok(Some(last_commit))) => {
            Ok(Verdict::Resume { next, last_offsets, last_commit })
        }
        (RecoveryPoint::Rerun { batch }, Ok(Some(offsets)), Ok(last_commit)) => {
            Ok(Verdict::Rerun { batch, offsets, last_commit })
        }
        // A file listed a moment ago vanished: another process is changing the directory.
        (_, Ok(_), Ok(_)) => {
            let reason = "a file vanished while inspecting; is another writer running?".to_string();
            let kind = InconsistencyKind::Unreadable { file: PathBuf::from(OFFSETS_DIR), reason };
            inconsistent(kind, shape)
        }
    }
}

type ReadLast<T> = std::result::Result<Option<T>, (PathBuf, String)>;

fn read_last<T: crate::log::LogEntry>(
    files: &dyn CheckpointFileManager,
    dir: &Path,
    sub: &str,
    id: Option<BatchId>,
) -> ReadLast<T> {
    let Some(id) = id else { return Ok(None) };
    let relative = Path::new(sub).join(id.0.to_string());
    let path = dir.join(&relative);
    let unreadable = |e: LogStoreError| (relative.clone(), e.to_string());
    match files.read(&path, MAX_LOG_FILE_BYTES).map_err(unreadable)? {
        None => Ok(None),
        Some(bytes) => decode_entry(&path, &bytes).map(Some).map_err(unreadable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u64]) -> Vec<BatchId> {
        v.iter().map(|i| BatchId(*i)).collect()
    }

    #[test]
    fn consistent_shapes() {
        assert_eq!(classify(&[], &[]), Ok(RecoveryPoint::Fresh));
        assert_eq!(classify(&ids(&[0]), &[]), Ok(RecoveryPoint::Rerun { batch: BatchId(0) }));
        assert_eq!(classify(&ids(&[0, 1, 2]), &ids(&[0, 1, 2])), Ok(RecoveryPoint::Resume { next: BatchId(3) }));
        assert_eq!(classify(&ids(&[0, 1, 2]), &ids(&[0, 1])), Ok(RecoveryPoint::Rerun { batch: BatchId(2) }));
        // After a purge, both logs start later.
        assert_eq!(classify(&ids(&[7, 8]), &ids(&[7])), Ok(RecoveryPoint::Rerun { batch: BatchId(8) }));
        assert_eq!(classify(&ids(&[7]), &[]), Ok(RecoveryPoint::Rerun { batch: BatchId(7) }));
    }

    #[test]
    fn inconsistent_shapes() {
        let commit_ahead = classify(&ids(&[0, 1]), &ids(&[0, 1, 2]));
        assert_eq!(
            commit_ahead,
            Err(InconsistencyKind::CommitAhead { last_offsets: Some(BatchId(1)), last_commit: BatchId(2) })
        );
        assert!(matches!(classify(&[], &ids(&[0])), Err(InconsistencyKind::CommitAhead { last_offsets: None, .. })));
        assert_eq!(
            classify(&ids(&[0, 1, 3]), &ids(&[0, 1])),
            Err(InconsistencyKind::OffsetsGap { missing: BatchId(2), next_present: BatchId(3) })
        );
        assert_eq!(
            classify(&ids(&[0, 1, 2, 3]), &ids(&[0, 2, 3])),
            Err(InconsistencyKind::CommitsGap { missing: BatchId(1), next_present: BatchId(2) })
        );
        assert_eq!(
            classify(&ids(&[0, 1, 2, 3]), &ids(&[0, 1])),
            Err(InconsistencyKind::GapBetween { last_commit: Some(BatchId(1)), last_offsets: BatchId(3) })
        );
        assert_eq!(
            classify(&ids(&[0, 1]), &[]),
            Err(InconsistencyKind::GapBetween { last_commit: None, last_offsets: BatchId(1) })
        );
    }
}
