//! The file sink: a batch's records staged as JSON lines files, decided by
//! a manifest, published under their final names, then recorded as
//! published; and the recovery that finishes or drops what a crash left.
//!
//! The steps of batch `B` (its key `<time>-<id>`), each durable before the
//! next starts (a file: temp file, fsync, link, directory fsync; in S3 one
//! PUT):
//!
//! 1. stage: every file to `_staging/B/<partition>/<name>`;
//! 2. decide: the manifest to `_staging/B/_manifest.json`;
//! 3. publish: each file moved to `<partition>/<name>` (a link then an
//!    unlink on a disk; a PUT-if-absent then a DELETE in S3);
//! 4. record: the same manifest to `_manifests/B.json`;
//! 5. clean: what is left of `_staging/B/` removed, and manifests beyond
//!    the newest [`FileSinkSettings::retained_manifests`] deleted.
//!
//! Recovery settles each batch under `_staging/`: with `_manifests/B.json`
//! it only cleans (5); with a decided manifest it publishes forward (3, 4,
//! 5), never undoing a moved file; without one the batch's output never
//! finished, so the runtime will run the batch again: its staged files are
//! dropped. A batch whose manifest is recorded is never written again.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use spate_core::Time;
use spate_core::sync::lock;
use spate_dstream::BatchInfo;
use spate_logstore::{
    CheckpointFileManager, LogStoreError, MAX_CHECKPOINT_FILE_BYTES, NO_FENCE, ObjectStoreSettings, file_manager_for,
    is_object_store_location,
};
use tracing::{info, warn};

use crate::error::{FilesError, Result};
use crate::manifest::{MAX_MANIFEST_BYTES, Manifest, ManifestFile};
use crate::partition::{BatchKey, Partitioning};

/// The directory of files being written (hidden from readers by its `_`).
pub const STAGING_DIR: &str = "_staging";
/// The directory of the manifests of published batches.
pub const MANIFESTS_DIR: &str = "_manifests";
/// The decided manifest inside a batch's staging directory.
pub const PENDING_MANIFEST: &str = "_manifest.json";
/// A file is cut once it reaches this many bytes, by default.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 128 << 20;
/// The most [`FileSinkSettings::max_file_bytes`] may be: a file may pass it
/// by one record, and a move in S3 reads the whole file, up to the log
/// store's limit of [`MAX_CHECKPOINT_FILE_BYTES`].
pub const MAX_FILE_BYTES_LIMIT: u64 = MAX_CHECKPOINT_FILE_BYTES / 2;
/// How many published batches keep their manifest, by default.
pub const DEFAULT_RETAINED_MANIFESTS: usize = 1_000;

/// The counter of data files published.
pub const FILES_PUBLISHED: &str = "spate_files_published_total";
/// The counter of records published.
pub const RECORDS_PUBLISHED: &str = "spate_files_records_published_total";
/// The counter of bytes published.
pub const BYTES_PUBLISHED: &str = "spate_files_bytes_published_total";

/// How a [`FileSink`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileSinkSettings {
    /// The directories records go to by event time ([`Partitioning::Hour`]).
    pub partitioning: Partitioning,
    /// A file is cut once it holds this many bytes (so one may pass it by
    /// one record); a partition's records of one batch take as many files
    /// as they need. At most [`MAX_FILE_BYTES_LIMIT`].
    pub max_file_bytes: u64,
    /// How many of the newest published batches keep their manifest in
    /// `_manifests/` (at least 1: a restart re-runs at most the last batch).
    pub retained_manifests: usize,
    /// How to reach an `s3://` location (unset fields from the `AWS_*` variables).
    pub object_store: ObjectStoreSettings,
}

impl Default for FileSinkSettings {
    fn default() -> Self {
        FileSinkSettings {
            partitioning: Partitioning::Hour,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            retained_manifests: DEFAULT_RETAINED_MANIFESTS,
            object_store: ObjectStoreSettings::default(),
        }
    }
}

impl FileSinkSettings {
    /// The defaults: hourly directories, 128 MiB files, 1,000 manifests.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `partitioning`.
    pub fn partitioned_by(mut self, partitioning: Partitioning) -> Self {
        self.partitioning = partitioning;
        self
    }

    /// With files cut at `bytes`.
    pub fn max_file_bytes(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// Keeping the manifests of the newest `batches` published batches.
    pub fn retained_manifests(mut self, batches: usize) -> Self {
        self.retained_manifests = batches;
        self
    }

    /// Reaching an `s3://` location with `settings`.
    pub fn object_store(mut self, settings: ObjectStoreSettings) -> Self {
        self.object_store = settings;
        self
    }

    fn check(&self, location: &Path) -> Result<()> {
        let refuse = |reason: String| FilesError::Settings { location: location.display().to_string(), reason };
        if self.max_file_bytes == 0 || self.max_file_bytes > MAX_FILE_BYTES_LIMIT {
            return Err(refuse(format!(
                "max_file_bytes is {}; it must be between 1 and {MAX_FILE_BYTES_LIMIT}",
                self.max_file_bytes
            )));
        }
        if self.retained_manifests == 0 {
            return Err(refuse("retained_manifests must be at least 1".into()));
        }
        Ok(())
    }
}

/// What [`FileSink::write_batch`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// The batch had no records: no file and no manifest.
    Empty,
    /// The batch's files were written and published by this call.
    Published(Manifest),
    /// An earlier attempt of the batch had decided its files (this call
    /// finished their publication if a crash had cut it short); nothing
    /// was written again.
    AlreadyPublished(Manifest),
}

/// What [`FileSink::recover`] settled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Batches whose decided files a crash left unpublished, now published.
    pub published: Vec<BatchKey>,
    /// Batches whose output never finished: their staged files were dropped.
    pub dropped: Vec<BatchKey>,
}

type EventTime<T> = Box<dyn Fn(&T) -> Time + Send + Sync>;

/// An exactly-once sink of JSON lines files partitioned by event time (see
/// the crate documentation for the layout, the protocol and the rule for
/// readers).
pub struct FileSink<T> {
    root: PathBuf,
    files: Arc<dyn CheckpointFileManager>,
    settings: FileSinkSettings,
    event_time: EventTime<T>,
    /// Whether this sink settled what earlier runs left; held while a batch
    /// is written, so the batches of one sink are written one at a time.
    recovered: Mutex<bool>,
}

impl<T> std::fmt::Debug for FileSink<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSink")
            .field("root", &self.root)
            .field("files", &self.files)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A path under `root` from a `/`-separated relative one.
fn under(root: &Path, relative: &str) -> PathBuf {
    let mut path = root.to_path_buf();
    path.extend(relative.split('/'));
    path
}

impl<T: Serialize> FileSink<T> {
    /// A sink writing under `location`, a directory or `s3://bucket/prefix`
    /// (S3 needs the crate's `s3` feature), records going to the partition
    /// of `event_time`. Nothing is read or written until the first batch:
    /// the job's checkpoint lock is what makes its runs one at a time, and
    /// the sink settles what an earlier run left only under that lock.
    pub fn open(
        location: impl AsRef<Path>,
        settings: FileSinkSettings,
        event_time: impl Fn(&T) -> Time + Send + Sync + 'static,
    ) -> Result<Self> {
        let location = location.as_ref();
        let files = file_manager_for(location, &settings.object_store).map_err(|source| FilesError::Store {
            location: location.display().to_string(),
            what: "reach its location".into(),
            source,
        })?;
        Self::with_file_manager(location, settings, files, event_time)
    }

    /// [`FileSink::open`] on the file manager `files` (an object store on
    /// a given client, or a fault-injecting manager in tests).
    pub fn with_file_manager(
        location: impl AsRef<Path>,
        settings: FileSinkSettings,
        files: Arc<dyn CheckpointFileManager>,
        event_time: impl Fn(&T) -> Time + Send + Sync + 'static,
    ) -> Result<Self> {
        let root = location.as_ref().to_path_buf();
        settings.check(&root)?;
        Ok(FileSink { root, files, settings, event_time: Box::new(event_time), recovered: Mutex::new(false) })
    }

    /// The sink's root.
    pub fn location(&self) -> &Path {
        &self.root
    }

    /// True when the root is in an object store.
    pub fn is_object_store(&self) -> bool {
        is_object_store_location(&self.root)
    }

    /// Writes the records of batch `info`: stages them as files, decides
    /// them with a manifest, publishes them and records the manifest (see
    /// the crate documentation). The first call of a sink first settles what earlier runs
    /// left ([`FileSink::recover`]). Call it from the batch's output, before
    /// the batch commits; an error fails the batch, and its re-run writes it
    /// again from where this left it.
    pub fn write_batch<'a, I>(&self, records: I, info: BatchInfo) -> Result<BatchOutcome>
    where
        I: IntoIterator<Item = &'a T>,
        T: 'a,
    {
        let key = BatchKey::new(info.time, info.batch_id);
        let mut recovered = lock(&self.recovered);
        if !*recovered {
            self.recover_locked()?;
            *recovered = true;
        }
        if let Some(manifest) = self.settle(key)? {
            info!(batch = %key.name(), location = %self.root.display(), "batch already published; not written again");
            return Ok(BatchOutcome::AlreadyPublished(manifest));
        }
        let files = self.stage(records, key)?;
        if files.is_empty() {
            self.remove_local_tree(&self.staging_dir(key));
            return Ok(BatchOutcome::Empty);
        }
        let manifest = Manifest::new(key, files);
        let bytes = manifest.encode();
        self.files
            .create_atomic(&self.pending_manifest(key), &bytes, NO_FENCE)
            .map_err(|e| self.store_error(format!("decide the files of batch {}", key.name()), e))?;
        self.publish(&manifest, &bytes)?;
        self.prune()?;
        Ok(BatchOutcome::Published(manifest))
    }

    /// Settles every batch under `_staging/`: publishes those whose files
    /// were decided, drops those whose output never finished, and deletes
    /// manifests beyond the newest [`FileSinkSettings::retained_manifests`].
    /// [`FileSink::write_batch`] calls it once, before its first batch; call
    /// it only where the job's lock is held (no run of the job is writing).
    pub fn recover(&self) -> Result<Recovery> {
        let mut recovered = lock(&self.recovered);
        let report = self.recover_locked()?;
        *recovered = true;
        Ok(report)
    }

    /// The manifests in `_manifests/`, oldest batch first: the batches
    /// whose files are all in place.
    pub fn published(&self) -> Result<Vec<Manifest>> {
        let mut manifests = Vec::new();
        for key in self.manifest_keys()? {
            if let Some(manifest) = self.read_manifest(&self.manifest_path(key), key)? {
                manifests.push(manifest);
            }
        }
        Ok(manifests)
    }

    fn recover_locked(&self) -> Result<Recovery> {
        let staging = self.root.join(STAGING_DIR);
        let names = self.files.list(&staging).map_err(|e| self.store_error("list the staged batches".into(), e))?;
        let mut keys: Vec<BatchKey> = Vec::new();
        for name in names {
            match BatchKey::parse(&name) {
                Some(key) => keys.push(key),
                None => warn!(entry = %staging.join(&name).display(), "not a staged batch; left alone"),
            }
        }
        keys.sort();
        let mut report = Recovery::default();
        for key in keys {
            let was_recorded = self.read_manifest(&self.manifest_path(key), key)?.is_some();
            match self.settle(key)? {
                Some(_) if !was_recorded => report.published.push(key),
                Some(_) => {}
                None => report.dropped.push(key),
            }
        }
        if !report.published.is_empty() || !report.dropped.is_empty() {
            info!(location = %self.root.display(), published = ?report.published, dropped = ?report.dropped,
                "file sink recovered what an earlier run left");
        }
        self.prune()?;
        Ok(report)
    }

    /// Brings batch `key` to a state with nothing of it staged: its manifest
    /// when its files were decided (published now if they were not yet),
    /// `None` when they were not (what was staged is dropped).
    fn settle(&self, key: BatchKey) -> Result<Option<Manifest>> {
        if let Some(manifest) = self.read_manifest(&self.manifest_path(key), key)? {
            self.clear_staging(key)?;
            return Ok(Some(manifest));
        }
        let pending = self.pending_manifest(key);
        let bytes = self.read_bounded(&pending, MAX_MANIFEST_BYTES, "read a decided manifest")?;
        match bytes {
            Some(bytes) => {
                let manifest = Manifest::decode(&bytes, key)
                    .map_err(|reason| FilesError::Manifest { path: pending.clone(), reason })?;
                self.publish(&manifest, &bytes)?;
                Ok(Some(manifest))
            }
            None => {
                self.clear_staging(key)?;
                Ok(None)
            }
        }
    }

    /// Stages the records as files of batch `key`; returns them.
    fn stage<'a, I>(&self, records: I, key: BatchKey) -> Result<Vec<ManifestFile>>
    where
        I: IntoIterator<Item = &'a T>,
        T: 'a,
    {
        let partitioning = self.settings.partitioning;
        let mut parts: BTreeMap<i64, OpenPart> = BTreeMap::new();
        let mut stager = Stager { sink: self, key, made: HashSet::new(), files: Vec::new() };
        for record in records {
            let time = (self.event_time)(record);
            let part =
                parts.entry(partitioning.bucket(time)).or_insert_with(|| OpenPart::new(partitioning.directory(time)));
            let before = part.buf.len();
            serde_json::to_writer(&mut part.buf, record).map_err(|source| FilesError::Encode {
                location: self.root.display().to_string(),
                batch_id: key.batch_id,
                source,
            })?;
            part.buf.push(b'\n');
            part.records += 1;
            // A file holds less than max_file_bytes before its last record,
            // so with records within the limit it stays within what a move reads.
            let line = (part.buf.len() - before) as u64;
            if line > MAX_FILE_BYTES_LIMIT {
                return Err(FilesError::RecordTooLarge {
                    location: self.root.display().to_string(),
                    batch_id: key.batch_id,
                    bytes: line,
                    limit: MAX_FILE_BYTES_LIMIT,
                });
            }
            if part.buf.len() as u64 >= self.settings.max_file_bytes {
                stager.stage(part)?;
            }
        }
        for part in parts.values_mut().filter(|p| p.records > 0) {
            stager.stage(part)?;
        }
        Ok(stager.files)
    }

    /// Moves every file of `manifest` into place, then records the manifest
    /// (`bytes`) and cleans the staging directory. Each step can be repeated
    /// after a crash at any point in it.
    fn publish(&self, manifest: &Manifest, bytes: &[u8]) -> Result<()> {
        let key = manifest.key();
        let mut made = HashSet::new();
        for file in &manifest.files {
            self.move_into_place(key, file, &mut made)?;
        }
        let recorded = self.manifest_path(key);
        self.mkdirs(&self.root.join(MANIFESTS_DIR), &mut made)?;
        match self.files.create_atomic(&recorded, bytes, NO_FENCE) {
            Ok(()) => {}
            // A crash after the record, before the clean: the same record.
            Err(LogStoreError::AlreadyExists { .. })
                if self.read_manifest(&recorded, key)?.as_ref() == Some(manifest) => {}
            Err(e) => return Err(self.store_error(format!("record the publication of batch {}", key.name()), e)),
        }
        self.clear_staging(key)?;
        metrics::counter!(FILES_PUBLISHED).increment(manifest.files.len() as u64);
        metrics::counter!(RECORDS_PUBLISHED).increment(manifest.records());
        metrics::counter!(BYTES_PUBLISHED).increment(manifest.files.iter().map(|f| f.bytes).sum());
        Ok(())
    }

    /// Moves one staged file to its final name; a file moved before a crash
    /// is checked against the manifest instead.
    fn move_into_place(&self, key: BatchKey, file: &ManifestFile, made: &mut HashSet<PathBuf>) -> Result<()> {
        let staged = under(&self.staging_dir(key), &file.path);
        let target = under(&self.root, &file.path);
        let what = || format!("publish a file of batch {}", key.name());
        if !self.files.exists(&staged).map_err(|e| self.store_error(what(), e))? {
            return self.check_published(key, file, &target);
        }
        if let Some(parent) = target.parent() {
            self.mkdirs(parent, made)?;
        }
        match self.files.rename_no_replace(&staged, &target, NO_FENCE) {
            Ok(()) => Ok(()),
            // Moved before a crash that left the staged name too (a link, then the unlink).
            Err(LogStoreError::AlreadyExists { .. }) => {
                self.check_published(key, file, &target)?;
                self.files.delete(&staged).map(|_| ()).map_err(|e| self.store_error(what(), e))
            }
            Err(e) => Err(self.store_error(what(), e)),
        }
    }

    /// Checks that `target` is the file the manifest lists.
    fn check_published(&self, key: BatchKey, file: &ManifestFile, target: &Path) -> Result<()> {
        let conflict =
            |reason: String| FilesError::Conflict { path: target.to_path_buf(), batch_id: key.batch_id, reason };
        let bytes = match self.files.read(target, file.bytes) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Err(FilesError::Missing { path: target.to_path_buf(), batch_id: key.batch_id }),
            Err(LogStoreError::TooLarge { len, .. }) => {
                return Err(conflict(format!("{len} bytes where the manifest lists {}", file.bytes)));
            }
            Err(e) => return Err(self.store_error(format!("check a published file of batch {}", key.name()), e)),
        };
        let crc = crc32c::crc32c(&bytes);
        if bytes.len() as u64 != file.bytes || crc != file.crc32c {
            return Err(conflict(format!(
                "{} bytes with CRC-32C {crc:#010x} where the manifest lists {} bytes with {:#010x}",
                bytes.len(),
                file.bytes,
                file.crc32c
            )));
        }
        Ok(())
    }

    /// Deletes what is left under the staging directory of `key`.
    fn clear_staging(&self, key: BatchKey) -> Result<()> {
        let dir = self.staging_dir(key);
        let what = || format!("clean the staging directory of batch {}", key.name());
        let left = self.files.list_files_recursive(&dir).map_err(|e| self.store_error(what(), e))?;
        // The decided manifest last: while it is there, the batch is still pending.
        let (manifests, files): (Vec<_>, Vec<_>) =
            left.into_iter().map(|(path, _)| dir.join(path)).partition(|p| p.ends_with(PENDING_MANIFEST));
        for path in files.into_iter().chain(manifests) {
            self.files.delete(&path).map_err(|e| self.store_error(what(), e))?;
        }
        self.remove_local_tree(&dir);
        Ok(())
    }

    /// Removes the (by now empty) directories of a staging tree on a disk;
    /// an object store has none. What stays (after a failure) is removed by
    /// the next recovery, so a failure here is only a warning.
    fn remove_local_tree(&self, dir: &Path) {
        if self.files.is_object_store() {
            return;
        }
        match std::fs::remove_dir_all(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn!(dir = %dir.display(), error = %e, "cannot remove a staging directory"),
        }
    }

    /// Deletes the manifests beyond the newest [`FileSinkSettings::retained_manifests`].
    fn prune(&self) -> Result<()> {
        let keys = self.manifest_keys()?;
        let excess = keys.len().saturating_sub(self.settings.retained_manifests);
        for key in keys.into_iter().take(excess) {
            self.files
                .delete(&self.manifest_path(key))
                .map_err(|e| self.store_error(format!("delete the old manifest of batch {}", key.name()), e))?;
        }
        Ok(())
    }

    /// The batches in `_manifests/`, oldest first.
    fn manifest_keys(&self) -> Result<Vec<BatchKey>> {
        let dir = self.root.join(MANIFESTS_DIR);
        let names = self.files.list(&dir).map_err(|e| self.store_error("list the manifests".into(), e))?;
        let mut keys: Vec<BatchKey> =
            names.iter().filter_map(|n| n.strip_suffix(".json")).filter_map(BatchKey::parse).collect();
        keys.sort();
        Ok(keys)
    }

    fn read_manifest(&self, path: &Path, key: BatchKey) -> Result<Option<Manifest>> {
        let Some(bytes) = self.read_bounded(path, MAX_MANIFEST_BYTES, "read a manifest")? else { return Ok(None) };
        Manifest::decode(&bytes, key)
            .map(Some)
            .map_err(|reason| FilesError::Manifest { path: path.to_path_buf(), reason })
    }

    fn read_bounded(&self, path: &Path, limit: u64, what: &str) -> Result<Option<Vec<u8>>> {
        match self.files.read(path, limit) {
            Ok(bytes) => Ok(bytes),
            Err(LogStoreError::TooLarge { len, limit, .. }) => Err(FilesError::Manifest {
                path: path.to_path_buf(),
                reason: format!("{len} bytes, more than a manifest may have ({limit})"),
            }),
            Err(e) => Err(self.store_error(what.to_string(), e)),
        }
    }

    fn mkdirs(&self, dir: &Path, made: &mut HashSet<PathBuf>) -> Result<()> {
        if made.contains(dir) {
            return Ok(());
        }
        self.files.mkdirs(dir).map_err(|e| self.store_error(format!("create the directory {}", dir.display()), e))?;
        made.insert(dir.to_path_buf());
        Ok(())
    }

    fn staging_dir(&self, key: BatchKey) -> PathBuf {
        self.root.join(STAGING_DIR).join(key.name())
    }

    fn pending_manifest(&self, key: BatchKey) -> PathBuf {
        self.staging_dir(key).join(PENDING_MANIFEST)
    }

    fn manifest_path(&self, key: BatchKey) -> PathBuf {
        self.root.join(MANIFESTS_DIR).join(format!("{}.json", key.name()))
    }

    fn store_error(&self, what: String, source: LogStoreError) -> FilesError {
        FilesError::Store { location: self.root.display().to_string(), what, source }
    }
}

/// The records of one partition not yet in a file.
struct OpenPart {
    directory: String,
    buf: Vec<u8>,
    records: u64,
    next_index: u32,
}

impl OpenPart {
    fn new(directory: String) -> Self {
        OpenPart { directory, buf: Vec::new(), records: 0, next_index: 0 }
    }
}

/// Writes the staged files of one batch.
struct Stager<'s, T> {
    sink: &'s FileSink<T>,
    key: BatchKey,
    made: HashSet<PathBuf>,
    files: Vec<ManifestFile>,
}

impl<T: Serialize> Stager<'_, T> {
    /// Stages what `part` holds as its next file and empties it.
    fn stage(&mut self, part: &mut OpenPart) -> Result<()> {
        let path = format!("{}/{}", part.directory, self.key.file_name(part.next_index));
        let staged = under(&self.sink.staging_dir(self.key), &path);
        if let Some(parent) = staged.parent() {
            self.sink.mkdirs(parent, &mut self.made)?;
        }
        self.sink
            .files
            .create_atomic(&staged, &part.buf, NO_FENCE)
            .map_err(|e| self.sink.store_error(format!("stage a file of batch {}", self.key.name()), e))?;
        self.files.push(ManifestFile {
            path,
            records: part.records,
            bytes: part.buf.len() as u64,
            crc32c: crc32c::crc32c(&part.buf),
        });
        part.buf.clear();
        part.records = 0;
        part.next_index += 1;
        Ok(())
    }
}
