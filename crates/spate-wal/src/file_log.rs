//! [`FileWriteAheadLog`]: the write-ahead log as a directory of segment files.
//!
//! Layout and semantics follow Spark's `FileBasedWriteAheadLog`: segments
//! named `log-<startMs>-<endMs>`, a new one when a record's time reaches the
//! end of the active one, cleaning by whole segments. On top of that: a
//! CRC on every record, group commit, torn-tail repair on open and a log
//! that refuses writes after a failed sync.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Condvar, Mutex, RwLock};

use spate_core::sync::{lock, read, write};
use spate_core::{Time, WalRecordHandle};

use crate::cleaner::Cleaner;
use crate::error::WalError;
use crate::files::{FileLayer, file_layer};
use crate::log::{RecordIter, WriteAheadLog};
use crate::reader::{AllRecords, read_record};
use crate::record::PADDING;
use crate::segment::Segment;
use crate::settings::WalSettings;
use crate::spares::Spares;
use crate::takeover::{check_fence, open_segments, refuse_later_epochs, restrict_files};
use crate::telemetry::WalMetrics;
use crate::writer::{CommitOrder, CommitQueue, Writer};

/// A write-ahead log in a directory of segment files.
///
/// Share it between threads (`Arc<FileWriteAheadLog>`): concurrent writes
/// are batched into one append and one `fdatasync` (group commit), and each
/// writer gets its handle once the sync that covers its record is done.
///
/// Opening a directory repairs it: a torn record at the end of the last
/// segment (never acknowledged) is cut off; damage anywhere else is a
/// [`WalError::Corrupt`] naming the segment and offset, unless
/// [`WalSettings::salvage`] is on. Open a directory with one log at a time.
pub struct FileWriteAheadLog {
    pub(crate) shared: Arc<Shared>,
    cleaner: Mutex<Option<Cleaner>>,
}

/// What the writer, readers and cleaner of one log share.
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    pub(crate) options: WalSettings,
    /// The fence's epoch, read once: it goes into every name this writer makes.
    pub(crate) epoch: u64,
    pub(crate) files: Arc<dyn FileLayer>,
    /// Live segments, oldest first. Cleaning takes segments out of this list
    /// before it deletes their files, so new readers never see them.
    pub(crate) segments: RwLock<Vec<Arc<Segment>>>,
    /// Zeroed files of cleaned segments that new segments start in.
    pub(crate) spares: Spares,
    pub(crate) queue: Mutex<CommitQueue>,
    /// Requests in the queue, readable without its lock (a gathering leader polls it).
    pub(crate) queued: AtomicUsize,
    /// Commits finish (become readable, report) in the order they appended.
    pub(crate) order: Mutex<CommitOrder>,
    pub(crate) group_finished: Condvar,
    pub(crate) writer: Mutex<Writer>,
    /// Appends, bytes and syncs, for `/metrics`.
    pub(crate) metrics: WalMetrics,
}

impl FileWriteAheadLog {
    /// Opens (creating when missing) the log in `dir`, repairing a torn tail
    /// of its last segment.
    ///
    /// With a fence of epoch `E` ([`WalSettings::fence`]): refuses a
    /// directory that holds a file of a later epoch
    /// ([`WalError::NewerEpoch`]) and one whose fence check fails
    /// ([`WalError::Fenced`]); on the first open at `E`, seals the earlier
    /// epochs' segments (see the crate documentation) before anything is
    /// appended. The directory and every file of the log are made
    /// owner-only.
    pub fn open(dir: impl AsRef<Path>, options: WalSettings) -> Result<Self, WalError> {
        let dir = dir.as_ref().to_path_buf();
        let mut options = options;
        // A record's length must leave the header's padding bit clear (and
        // so a handle's length, header included, fits in a u32).
        options.max_record_size = options.max_record_size.min(PADDING - 1);
        let epoch = options.fence.epoch();
        let files = file_layer(&options);
        files.create_dir_all(&dir).map_err(WalError::io("create directory", &dir))?;
        let names = files.list(&dir).map_err(WalError::io("list", &dir))?;
        refuse_later_epochs(&dir, &names, epoch)?;
        check_fence(&dir, &options, "open")?;
        restrict_files(files.as_ref(), &dir, &names)?;
        let segments = open_segments(files.as_ref(), &dir, &names, &options)?;
        let spares = Spares::open(files.as_ref(), &dir, &names, options.recycled_segments, epoch);
        tracing::debug!(dir = %dir.display(), segments = segments.len(), epoch, "opened write-ahead log");
        let writer = Writer::new(options.clock.now());
        let shared = Shared {
            metrics: WalMetrics::for_dir(&dir),
            dir,
            options,
            epoch,
            files,
            segments: RwLock::new(segments),
            spares,
            queue: Mutex::new(CommitQueue::default()),
            queued: AtomicUsize::new(0),
            order: Mutex::new(CommitOrder::default()),
            group_finished: Condvar::new(),
            writer: Mutex::new(writer),
        };
        Ok(FileWriteAheadLog { shared: Arc::new(shared), cleaner: Mutex::new(None) })
    }

    /// Appends several records as one group (one append, one sync) and
    /// returns their handles in order, once they are durable.
    pub fn write_batch(&self, records: &[(&[u8], Time)]) -> Result<Vec<WalRecordHandle>, WalError> {
        self.shared.write_batch(records)
    }

    /// Syncs the active segment now (useful with [`crate::SyncPolicy::Interval`]).
    pub fn sync(&self) -> Result<(), WalError> {
        self.shared.sync_now()
    }

    /// The log directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Writes queued for the next commit (while one is in progress): a
    /// gauge of how much group commit is batching.
    pub fn queued_writes(&self) -> usize {
        self.shared.queued.load(std::sync::atomic::Ordering::Acquire)
    }

    /// This writer's epoch (its fence's; 0 when unfenced).
    pub fn epoch(&self) -> u64 {
        self.shared.epoch
    }

    /// Bytes appended with direct I/O (`O_DIRECT`) so far: 0 when
    /// [`WalSettings::direct_io`] is off, or the file system refuses it
    /// (then appends are buffered).
    pub fn direct_io_bytes(&self) -> u64 {
        self.shared.files.direct_bytes()
    }

    /// The file names of the live segments, oldest first (those of earlier
    /// epochs included, however much of them this writer reads).
    pub fn segment_names(&self) -> Vec<String> {
        read(&self.shared.segments).iter().map(|s| s.name.clone()).collect()
    }

    fn retire_in_background(&self, victims: Vec<Arc<Segment>>) {
        let mut cleaner = lock(&self.cleaner);
        let cleaner = cleaner.get_or_insert_with(|| Cleaner::start(Arc::clone(&self.shared)));
        if let Err(victims) = cleaner.submit(victims) {
            // The thread is gone (it could not be started): do it here.
            if let Err(e) = self.shared.retire_segments(&victims) {
                tracing::warn!(error = %e, "cleaning write-ahead log segments failed");
            }
        }
    }
}

impl std::fmt::Debug for FileWriteAheadLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriteAheadLog").field("dir", &self.shared.dir).finish_non_exhaustive()
    }
}

impl WriteAheadLog for FileWriteAheadLog {
    fn write(&self, record: &[u8], time: Time) -> Result<WalRecordHandle, WalError> {
        let handles = self.shared.write_batch(&[(record, time)])?;
        self.shared.only_handle(handles)
    }

    fn write_shared(&self, record: Arc<Vec<u8>>, time: Time) -> Result<WalRecordHandle, WalError> {
        let crc = crc32c::crc32c(&record);
        self.shared.write_shared(record, crc, time)
    }

    fn write_shared_with_crc32c(
        &self,
        record: Arc<Vec<u8>>,
        crc32c: u32,
        time: Time,
    ) -> Result<WalRecordHandle, WalError> {
        debug_assert_eq!(crc32c, crc32c::crc32c(&record), "a caller's CRC32C does not match its record");
        self.shared.write_shared(record, crc32c, time)
    }

    fn read(&self, handle: &WalRecordHandle) -> Result<Vec<u8>, WalError> {
        read_record(&self.shared, handle)
    }

    fn read_all(&self) -> Result<RecordIter<'_>, WalError> {
        let snapshot = read(&self.shared.segments).iter().map(|s| (Arc::clone(s), s.readable_len())).collect();
        Ok(Box::new(AllRecords::new(&self.shared, snapshot)))
    }

    fn clean(&self, threshold: Time, wait_for_completion: bool) -> Result<(), WalError> {
        self.shared.fence_writer("clean")?;
        let victims: Vec<Arc<Segment>> = {
            let mut segments = write(&self.shared.segments);
            let (old, keep) = segments.drain(..).partition(|s| s.end < threshold && !s.is_active());
            *segments = keep;
            old
        };
        if victims.is_empty() {
            return Ok(());
        }
        tracing::debug!(dir = %self.shared.dir.display(), segments = victims.len(), %threshold, "cleaning old segments");
        if wait_for_completion {
            self.shared.retire_segments(&victims)
        } else {
            self.retire_in_background(victims);
            Ok(())
        }
    }

    fn close(&self) -> Result<(), WalError> {
        let result = self.shared.close_writer();
        if let Some(cleaner) = lock(&self.cleaner).take() {
            cleaner.finish();
        }
        result
    }
}

impl Drop for FileWriteAheadLog {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(dir = %self.shared.dir.display(), error = %e, "closing write-ahead log failed");
        }
    }
}

impl Shared {
    /// Deletes or recycles the files of `victims` (already out of the live
    /// list). A file that is already gone is fine; the first other failure
    /// is returned after trying them all.
    pub(crate) fn retire_segments(&self, victims: &[Arc<Segment>]) -> Result<(), WalError> {
        let mut first_error = None;
        for segment in victims {
            self.fence_writer("delete")?;
            match self.spares.retire(self.files.as_ref(), &segment.path, segment.epoch) {
                Ok(()) => tracing::debug!(segment = %segment.path.display(), "retired segment"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(segment = %segment.path.display(), error = %e, "deleting segment failed");
                    first_error.get_or_insert(WalError::Io { op: "remove", path: segment.path.clone(), source: e });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
