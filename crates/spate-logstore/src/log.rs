//! [`MetadataLog`]: a directory of numbered, write-once entries (Spark's
//! `HDFSMetadataLog`).
//!
//! Entry `N` is the file `<dir>/N` (plain decimal, no padding). Each file is
//! text: a version line `v1`, then the entry's own lines (JSON). Entries are
//! written once with a put-if-absent and never changed; names that are not a
//! canonical decimal id (temp files, `.crc` files, `007`) are ignored.
//!
//! # Checksum
//!
//! When the line after the version is a JSON object, spate ends it with a
//! `"crc32c"` field: eight hex digits, the CRC-32C of the whole file as it
//! would be without that field. Spark's readers ignore fields they do not
//! know, so the file stays readable by Spark, and files without the field
//! (written by Spark, or by spate before it had checksums) are read as
//! before. A file whose checksum does not match, or whose field is damaged,
//! is refused with an error naming it.
//!
//! ```text
//! v1
//! {"nextBatchWatermarkMs":0,"crc32c":"4b1a0f3e"}
//! ```

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use spate_core::BatchId;
use tracing::{debug, warn};

use crate::error::{LogStoreError, Result};
use crate::file_manager::CheckpointFileManager;
use crate::lock::EpochFence;

/// The largest log file read; anything longer is refused as damaged
/// rather than read into memory.
pub const MAX_LOG_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Why an entry's body did not decode: the line (1-based, counting the
/// version line as line 1) and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyError {
    /// The 1-based line of the file where the problem is.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl BodyError {
    /// An error at `line` of the file.
    pub fn new(line: usize, reason: impl Into<String>) -> Self {
        BodyError { line, reason: reason.into() }
    }
}

/// A type that can be an entry of a [`MetadataLog`]: how it is written
/// after the version line and read back.
pub trait LogEntry: Sized {
    /// The format version this build writes, and the newest it reads.
    const VERSION: u32;

    /// The text after the `v<VERSION>` line (without a leading newline).
    fn encode_body(&self) -> Result<String, String>;

    /// Reads the text after the version line of a file of format `version`
    /// (at most [`LogEntry::VERSION`]). Line numbers in errors count the
    /// version line as line 1.
    fn decode_body(version: u32, body: &str) -> Result<Self, BodyError>;
}

/// Wraps any serde type as a single-JSON-line [`LogEntry`] (format v1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Json<T>(pub T);

impl<T: Serialize + DeserializeOwned> LogEntry for Json<T> {
    const VERSION: u32 = 1;

    fn encode_body(&self) -> Result<String, String> {
        serde_json::to_string(&self.0).map_err(|e| e.to_string())
    }

    fn decode_body(_version: u32, body: &str) -> Result<Self, BodyError> {
        let line = first_line(body).ok_or_else(|| BodyError::new(2, "missing the JSON line after the version"))?;
        serde_json::from_str(line).map(Json).map_err(|e| BodyError::new(2, e.to_string()))
    }
}

/// The first line of `body`, if there is one (an empty body has none).
pub(crate) fn first_line(body: &str) -> Option<&str> {
    body.lines().next()
}

/// Encodes an entry as the bytes of its file, with its checksum (see the module docs).
pub fn encode_entry<T: LogEntry>(entry: &T) -> Result<Vec<u8>, String> {
    encode_entry_by(entry, None)
}

/// The key of the field naming the epoch of the writer that wrote an entry.
const WRITER_EPOCH_KEY: &str = "writerEpoch";

/// [`encode_entry`], naming the writer's epoch in line 2 when it is a JSON
/// object (readers that do not know the field, Spark's included, ignore it).
fn encode_entry_by<T: LogEntry>(entry: &T, writer_epoch: Option<u64>) -> Result<Vec<u8>, String> {
    let mut body = entry.encode_body()?;
    if let Some(epoch) = writer_epoch {
        let end = body.find('\n').unwrap_or(body.len());
        let line = body[..end].trim_end();
        if line.starts_with('{') && line.ends_with('}') {
            let comma = if line == "{}" { "" } else { "," };
            body.insert_str(line.len() - 1, &format!("{comma}\"{WRITER_EPOCH_KEY}\":{epoch}"));
        }
    }
    Ok(add_checksum(format!("v{}\n{body}", T::VERSION).into_bytes()))
}

/// The epoch of the writer that wrote an entry, when it says.
fn writer_epoch_of(bytes: &[u8]) -> Option<u64> {
    let (start, end) = second_line(bytes)?;
    let line: serde_json::Value = serde_json::from_slice(&bytes[start..end]).ok()?;
    line.get(WRITER_EPOCH_KEY)?.as_u64()
}

/// Decodes the bytes of a log file; `path` is only used to name the file in
/// errors. A newer version is refused first, then the checksum is checked
/// (when there is one), then the entry decoded.
pub fn decode_entry<T: LogEntry>(path: &Path, bytes: &[u8]) -> Result<T> {
    split_version(path, bytes, T::VERSION)?;
    let unchecked = strip_checksum(path, bytes)?;
    let (version, body) = split_version(path, &unchecked, T::VERSION)?;
    T::decode_body(version, body).map_err(|e| LogStoreError::Malformed {
        path: path.to_path_buf(),
        line: e.line,
        reason: e.reason,
    })
}

/// The key of the checksum field.
const CHECKSUM_KEY: &[u8] = br#""crc32c":""#;
/// `"crc32c":"` + 8 hex digits + `"`.
const CHECKSUM_FIELD_LEN: usize = CHECKSUM_KEY.len() + 8 + 1;

/// Where line 2 of `bytes` (the line after the version) starts and ends.
fn second_line(bytes: &[u8]) -> Option<(usize, usize)> {
    let start = bytes.iter().position(|b| *b == b'\n')? + 1;
    let end = bytes[start..].iter().position(|b| *b == b'\n').map_or(bytes.len(), |n| start + n);
    Some((start, end))
}

/// `bytes` with the checksum field put at the end of line 2, when line 2 is
/// a JSON object.
fn add_checksum(mut bytes: Vec<u8>) -> Vec<u8> {
    let Some((start, end)) = second_line(&bytes) else { return bytes };
    let line = &bytes[start..end];
    if line.len() < 2 || line[0] != b'{' || line[line.len() - 1] != b'}' {
        return bytes;
    }
    let comma = if line == b"{}" { "" } else { "," };
    let field = format!("{comma}\"crc32c\":\"{:08x}\"", crc32c::crc32c(&bytes));
    bytes.splice(end - 1..end - 1, field.into_bytes());
    bytes
}

/// `bytes` without its checksum field, once the checksum is verified; the
/// bytes as they are when there is none.
fn strip_checksum<'a>(path: &Path, bytes: &'a [u8]) -> Result<Cow<'a, [u8]>> {
    let Some((start, end)) = second_line(bytes) else { return Ok(Cow::Borrowed(bytes)) };
    let line = &bytes[start..end];
    // The last occurrence: the field ends the line, and a key of the same name may come earlier.
    let Some(at) = rfind(line, CHECKSUM_KEY) else { return Ok(Cow::Borrowed(bytes)) };
    let damaged = |reason: &str| LogStoreError::Malformed { path: path.to_path_buf(), line: 2, reason: reason.into() };
    // The field must be the last one, exactly as written: `…,"crc32c":"xxxxxxxx"}`.
    let field_end = at + CHECKSUM_FIELD_LEN;
    if field_end + 1 != line.len() || line[line.len() - 1] != b'}' || line[field_end - 1] != b'"' {
        return Err(damaged("the checksum field is damaged (it must end the line as \"crc32c\":\"<8 hex digits>\")"));
    }
    let hex = &line[at + CHECKSUM_KEY.len()..field_end - 1];
    let stored = std::str::from_utf8(hex)
        .ok()
        .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or_else(|| damaged("the checksum is not 8 hex digits"))?;
    let cut_from = match at.checked_sub(1) {
        Some(comma) if line[comma] == b',' => comma,
        Some(0) => at,
        _ => return Err(damaged("the checksum field is damaged (no comma before it)")),
    };
    let mut unchecked = Vec::with_capacity(bytes.len());
    unchecked.extend_from_slice(&bytes[..start + cut_from]);
    unchecked.extend_from_slice(&bytes[start + field_end..]);
    let computed = crc32c::crc32c(&unchecked);
    if computed != stored {
        return Err(LogStoreError::ChecksumMismatch { path: path.to_path_buf(), stored, computed });
    }
    Ok(Cow::Owned(unchecked))
}

/// The last position of `needle` in `haystack`.
fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// Checks the version line and returns the version and the rest of the text.
pub(crate) fn split_version<'a>(path: &Path, bytes: &'a [u8], supported: u32) -> Result<(u32, &'a str)> {
    if bytes.is_empty() {
        return Err(LogStoreError::EmptyFile { path: path.to_path_buf() });
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| LogStoreError::NotText { path: path.to_path_buf(), byte_offset: e.valid_up_to() as u64 })?;
    let (first, body) = text.split_once('\n').unwrap_or((text, ""));
    let first = first.strip_suffix('\r').unwrap_or(first);
    let version = parse_version_line(first).ok_or_else(|| LogStoreError::Malformed {
        path: path.to_path_buf(),
        line: 1,
        reason: format!("expected a version line like `v1`, found {:?}", clip(first)),
    })?;
    if version > supported {
        return Err(LogStoreError::NewerVersion { path: path.to_path_buf(), found: version, supported });
    }
    Ok((version, body))
}

fn parse_version_line(line: &str) -> Option<u32> {
    let digits = line.strip_prefix('v')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u32>().ok().filter(|v| *v > 0)
}

/// At most 60 characters of `s`, for error messages about untrusted input.
pub(crate) fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(60).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// The batch id a file name stands for, if it is a canonical decimal id
/// that fits a `u64`. ([`BatchId::next`] of the largest, `u64::MAX`, does
/// not exist: the verdict reports such a file as an inconsistency.)
pub fn parse_batch_file_name(name: &str) -> Option<BatchId> {
    match batch_name(name) {
        BatchName::Id(id) => Some(id),
        BatchName::TooLarge | BatchName::Other => None,
    }
}

/// What a name in a log directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BatchName {
    /// A canonical decimal batch id.
    Id(BatchId),
    /// A canonical decimal number too large for a batch id: a damaged or
    /// foreign entry, never one spate wrote.
    TooLarge,
    /// Anything else (temp files, `.crc` files, `007`): not an entry.
    Other,
}

pub(crate) fn batch_name(name: &str) -> BatchName {
    let canonical =
        !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) && (name == "0" || !name.starts_with('0'));
    if !canonical {
        return BatchName::Other;
    }
    // All digits, so the only way to fail is overflow.
    name.parse::<u64>().map_or(BatchName::TooLarge, |n| BatchName::Id(BatchId(n)))
}

/// Who may write to a log.
#[derive(Clone, Debug)]
enum Access {
    /// Anyone (a log opened on its own, as Spark's).
    Unfenced,
    /// Only while the checkpoint's lock file still shows our epoch.
    Fenced(Arc<EpochFence>),
    /// Nobody.
    ReadOnly,
}

/// A log of numbered, write-once entries in one directory (see the module docs).
///
/// `add` never overwrites: the first writer of an id wins and later ones get
/// `false`. Logs obtained from a [`crate::Checkpoint`] opened for writing also
/// check, before every change, that the writer still holds the checkpoint
/// (its epoch is the one in the lock file).
pub struct MetadataLog<T> {
    dir: PathBuf,
    files: Arc<dyn CheckpointFileManager>,
    access: Access,
    _entry: PhantomData<fn() -> T>,
}

impl<T> Clone for MetadataLog<T> {
    fn clone(&self) -> Self {
        MetadataLog {
            dir: self.dir.clone(),
            files: self.files.clone(),
            access: self.access.clone(),
            _entry: PhantomData,
        }
    }
}

impl<T> fmt::Debug for MetadataLog<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataLog").field("dir", &self.dir).field("access", &self.access).finish()
    }
}

impl<T: LogEntry> MetadataLog<T> {
    /// A log in `dir`, creating the directory (owner-only) if needed.
    pub fn open(files: Arc<dyn CheckpointFileManager>, dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        files.mkdirs(&dir)?;
        Ok(MetadataLog { dir, files, access: Access::Unfenced, _entry: PhantomData })
    }

    /// A log in `dir` that refuses every change and creates nothing.
    pub fn open_read_only(files: Arc<dyn CheckpointFileManager>, dir: impl Into<PathBuf>) -> Self {
        MetadataLog { dir: dir.into(), files, access: Access::ReadOnly, _entry: PhantomData }
    }

    pub(crate) fn open_fenced(
        files: Arc<dyn CheckpointFileManager>,
        dir: impl Into<PathBuf>,
        fence: Arc<EpochFence>,
    ) -> Result<Self> {
        let mut log = Self::open(files, dir)?;
        log.access = Access::Fenced(fence);
        Ok(log)
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of entry `id`.
    pub fn path_of(&self, id: BatchId) -> PathBuf {
        self.dir.join(id.0.to_string())
    }

    /// [`MetadataLog::check_writable`] against the lock as it is on the store.
    fn confirm_writable(&self) -> Result<()> {
        match &self.access {
            Access::Fenced(fence) => fence.confirm(),
            Access::Unfenced | Access::ReadOnly => self.check_writable(),
        }
    }

    fn check_writable(&self) -> Result<()> {
        match &self.access {
            Access::Unfenced => Ok(()),
            Access::Fenced(fence) => fence.check(),
            Access::ReadOnly => Err(LogStoreError::ReadOnly { path: self.dir.clone() }),
        }
    }

    /// Writes entry `id` if there is none: `Ok(true)` when written, `Ok(false)`
    /// when the id already exists (the existing entry is left as it is).
    /// The largest id, which no batch could follow, is refused with
    /// [`LogStoreError::OutOfRange`]. The writer's fence is checked first and
    /// again immediately before the entry's name appears.
    pub fn add(&self, id: BatchId, entry: &T) -> Result<bool> {
        self.check_writable()?;
        let path = self.path_of(id);
        if id.next().is_none() {
            let reason = format!("batch id {id} is the largest there is; no batch could follow it");
            return Err(LogStoreError::OutOfRange { path, reason });
        }
        // On a disk a stat spares writing and syncing a temp file for an entry
        // that is there. On an object store the put-if-absent is the check
        // itself: a HEAD first (and a LIST, since a missing object may be a
        // "directory") would make each entry three requests instead of one.
        let looked_first = !self.files.is_object_store();
        if looked_first && self.files.exists(&path)? {
            debug!(path = %path.display(), "entry exists; not overwritten");
            self.check_not_newer(&path)?;
            return Ok(false);
        }
        let bytes = encode_entry_by(entry, self.fence().map(|f| f.epoch()))
            .map_err(|reason| LogStoreError::Encode { path: path.clone(), reason })?;
        match self.files.create_atomic(&path, &bytes, &|| self.check_writable()) {
            Ok(()) => Ok(true),
            Err(LogStoreError::AlreadyExists { .. }) => {
                if looked_first {
                    // Lost a race with another writer of the same id (Spark calls this a
                    // concurrent update): theirs stands.
                    warn!(path = %path.display(), "another writer added this entry first");
                } else {
                    debug!(path = %path.display(), "entry exists; not overwritten");
                }
                self.check_not_newer(&path)?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn fence(&self) -> Option<&Arc<EpochFence>> {
        match &self.access {
            Access::Fenced(fence) => Some(fence),
            Access::Unfenced | Access::ReadOnly => None,
        }
    }

    /// Fails with [`LogStoreError::StaleEpoch`] when the entry at `path` was
    /// written by a newer writer than this one: this writer lost the
    /// checkpoint (a lease that ran out while it was paused) and must stop.
    fn check_not_newer(&self, path: &Path) -> Result<()> {
        let Some(fence) = self.fence() else { return Ok(()) };
        let Some(bytes) = self.files.read(path, MAX_LOG_FILE_BYTES)? else { return Ok(()) };
        match writer_epoch_of(&bytes) {
            Some(theirs) if theirs > fence.epoch() => Err(LogStoreError::StaleEpoch {
                dir: self.dir.parent().unwrap_or(&self.dir).to_path_buf(),
                ours: fence.epoch(),
                on_disk: format!("epoch {theirs}, which wrote {}", path.display()),
            }),
            _ => Ok(()),
        }
    }

    /// Entry `id`, or `None` when there is none. A damaged file is an error naming it.
    pub fn get(&self, id: BatchId) -> Result<Option<T>> {
        let path = self.path_of(id);
        match self.files.read(&path, MAX_LOG_FILE_BYTES)? {
            None => Ok(None),
            Some(bytes) => decode_entry(&path, &bytes).map(Some),
        }
    }

    /// The ids present, in numeric order (9 < 10 < 100). Lists the directory; reads no file.
    pub fn ids(&self) -> Result<Vec<BatchId>> {
        let mut ids = self.files.list_batch_ids(&self.dir)?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// The entries with `start <= id <= end` (either bound may be open), in order.
    pub fn get_range(&self, start: Option<BatchId>, end: Option<BatchId>) -> Result<Vec<(BatchId, T)>> {
        let in_range = |id: &BatchId| start.is_none_or(|s| *id >= s) && end.is_none_or(|e| *id <= e);
        let mut entries = Vec::new();
        for id in self.ids()?.into_iter().filter(in_range) {
            // An entry purged between the listing and the read is skipped.
            if let Some(entry) = self.get(id)? {
                entries.push((id, entry));
            }
        }
        Ok(entries)
    }

    /// The highest id present, without reading any file.
    pub fn latest_id(&self) -> Result<Option<BatchId>> {
        Ok(self.ids()?.last().copied())
    }

    /// The entry with the highest id. Reads one file (more only if entries
    /// vanish while it looks, which a concurrent purge can cause).
    pub fn latest(&self) -> Result<Option<(BatchId, T)>> {
        for id in self.ids()?.into_iter().rev() {
            if let Some(entry) = self.get(id)? {
                return Ok(Some((id, entry)));
            }
        }
        Ok(None)
    }

    /// Deletes every entry with an id below `threshold`; returns how many.
    /// The fence is checked before each deletion, against the lock as it is
    /// now ([`EpochFence::confirm`]: a delete has no put-if-absent to refuse
    /// a stale writer), so a writer that lost the checkpoint deletes nothing
    /// more.
    pub fn purge(&self, threshold: BatchId) -> Result<usize> {
        self.check_writable()?;
        let mut removed = 0;
        for id in self.ids()?.into_iter().take_while(|id| *id < threshold) {
            if self.files.delete_fenced(&self.path_of(id), &|| self.confirm_writable())? {
                removed += 1;
            }
        }
        debug!(dir = %self.dir.display(), %threshold, removed, "purged log entries");
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_manager::LocalFileManager;
    use serde::Deserialize;

    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    struct Note {
        n: u64,
    }

    fn log(dir: &Path) -> MetadataLog<Json<Note>> {
        MetadataLog::open(Arc::new(LocalFileManager), dir.join("log")).unwrap()
    }

    #[test]
    fn add_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let log = log(dir.path());
        assert!(log.add(BatchId(0), &Json(Note { n: 1 })).unwrap());
        assert!(!log.add(BatchId(0), &Json(Note { n: 2 })).unwrap());
        assert_eq!(log.get(BatchId(0)).unwrap(), Some(Json(Note { n: 1 })));
        let text = std::fs::read_to_string(log.path_of(BatchId(0))).unwrap();
        assert!(text.starts_with("v1\n{\"n\":1,\"crc32c\":\""), "{text}");
    }

    #[test]
    fn ids_sort_numerically_and_ignore_strangers() {
        let dir = tempfile::tempdir().unwrap();
        let log = log(dir.path());
        for id in [100, 9, 10] {
            log.add(BatchId(id), &Json(Note { n: id })).unwrap();
        }
        for stranger in [".9.crc", "007", "x", "-1", ".10.123.0.tmp", "18446744073709551616"] {
            std::fs::write(log.dir().join(stranger), b"junk").unwrap();
        }
        assert_eq!(log.ids().unwrap(), vec![BatchId(9), BatchId(10), BatchId(100)]);
        assert_eq!(log.latest().unwrap(), Some((BatchId(100), Json(Note { n: 100 }))));
        let range = log.get_range(Some(BatchId(10)), None).unwrap();
        assert_eq!(range.iter().map(|(id, _)| id.0).collect::<Vec<_>>(), vec![10, 100]);
        let range = log.get_range(None, Some(BatchId(10))).unwrap();
        assert_eq!(range.iter().map(|(id, _)| id.0).collect::<Vec<_>>(), vec![9, 10]);
    }

    #[test]
    fn purge_removes_ids_below_the_threshold() {
        let dir = tempfile::tempdir().unwrap();
        let log = log(dir.path());
        for id in 0..5 {
            log.add(BatchId(id), &Json(Note { n: id })).unwrap();
        }
        assert_eq!(log.purge(BatchId(3)).unwrap(), 3);
        assert_eq!(log.ids().unwrap(), vec![BatchId(3), BatchId(4)]);
        assert_eq!(log.get(BatchId(1)).unwrap(), None);
    }

    #[test]
    fn read_only_log_refuses_changes() {
        let dir = tempfile::tempdir().unwrap();
        let log: MetadataLog<Json<Note>> = MetadataLog::open_read_only(Arc::new(LocalFileManager), dir.path());
        assert!(matches!(log.add(BatchId(0), &Json(Note { n: 0 })), Err(LogStoreError::ReadOnly { .. })));
        assert!(matches!(log.purge(BatchId(1)), Err(LogStoreError::ReadOnly { .. })));
    }

    #[test]
    fn version_line_errors_name_the_file() {
        let path = Path::new("/ck/commits/4");
        let cases: [(&[u8], &str); 6] = [
            (b"", "empty"),
            (b"v2\n{}", "written by a newer spate"),
            (b"v1x\n{}", "expected a version line"),
            (b"v0\n{}", "expected a version line"),
            (b"\xff\xfe", "not UTF-8"),
            (b"v1\n", "missing the JSON line"),
        ];
        for (bytes, expected) in cases {
            let err = decode_entry::<Json<Note>>(path, bytes).unwrap_err().to_string();
            assert!(err.contains("/ck/commits/4") && err.contains(expected), "{bytes:?}: {err}");
        }
    }

    #[test]
    fn batch_file_names_are_canonical_decimals() {
        assert_eq!(parse_batch_file_name("0"), Some(BatchId(0)));
        assert_eq!(parse_batch_file_name("120"), Some(BatchId(120)));
        for bad in ["", "01", "+1", "1.crc", " 1", "1e3"] {
            assert_eq!(parse_batch_file_name(bad), None, "{bad}");
        }
    }
}
