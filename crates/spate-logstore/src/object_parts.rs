//! A streamed file larger than one part, on S3: uploaded a part at a time
//! and published by a manifest.
//!
//! A conditional PUT needs the whole body in hand, and S3 offers no
//! conditional multipart upload (`object_store` has none), so a streamed
//! file (a state snapshot) would be collected whole in memory before its
//! put-if-absent. Instead, once a file outgrows its first part, each full
//! part is uploaded as an object of its own under `<name>.parts/`, with a
//! key no other write uses (so a put-if-absent of it cannot meet another
//! writer), and the file is published by one put-if-absent, at its own key,
//! of a small manifest naming the parts in order with their lengths and
//! ETags. Until the manifest lands the parts are invisible; a reader reads
//! the parts, each range conditional on the ETag the manifest lists, so a
//! part changed since is a failed read, never other content. A file
//! within one part is one put-if-absent of its bytes, as before.
//!
//! What the writer holds: the first part until the end (a frame's header
//! is filled in last, seeking back to the file's start), the part being
//! filled, and the one before it while its upload is under way (one at a
//! time, on a thread of its own, so filling and uploading overlap): three
//! parts rather than the file.
//!
//! The parts go with the file ([`crate::CheckpointFileManager::delete_streamed`]
//! deletes the manifest, then everything under `<name>.parts/`, which also
//! takes parts a crashed upload left).

use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use object_store::{PutMode, PutPayload};

use crate::error::{LogStoreError, Result};
use crate::file_manager::{FileVersion, PARTS_SUFFIX, PublishCheck};
use crate::object_files::ObjectStoreFileManager;

/// The first line of a manifest; no other checkpoint file starts so (they
/// are frames, JSON or an epoch line).
pub(crate) const MANIFEST_MAGIC: &[u8] = b"spate-parts 1\n";
/// A manifest is at most this long: some 100 bytes a part.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// The bytes of one part, by default: a 24 MB snapshot is three parts.
pub(crate) const PART_BYTES: usize = 8 << 20;

/// One part of a file, as its manifest lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Part {
    /// The part's path (under the file manager's location).
    pub(crate) path: PathBuf,
    pub(crate) len: u64,
    pub(crate) e_tag: String,
}

/// The directory of `path`'s parts: `<name>.parts` beside it.
pub(crate) fn parts_dir(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(std::ffi::OsStr::to_os_string).unwrap_or_default();
    name.push(PARTS_SUFFIX);
    path.with_file_name(name)
}

/// The manifest naming `parts`, in order.
pub(crate) fn encode_manifest(parts: &[Part], root: &Path) -> Vec<u8> {
    let mut out = MANIFEST_MAGIC.to_vec();
    for part in parts {
        let relative = part.path.strip_prefix(root).unwrap_or(&part.path);
        out.extend_from_slice(format!("{} {} {}\n", part.len, part.e_tag, relative.display()).as_bytes());
    }
    out
}

/// The parts `bytes` name when they are a manifest; `None` when they are
/// not one; an error when they start as one and do not parse.
pub(crate) fn parse_manifest(bytes: &[u8], root: &Path, path: &Path) -> Result<Option<Vec<Part>>> {
    let Some(body) = bytes.strip_prefix(MANIFEST_MAGIC) else { return Ok(None) };
    let malformed = |line: usize, reason: String| LogStoreError::Malformed { path: path.to_path_buf(), line, reason };
    let text = std::str::from_utf8(body).map_err(|_| malformed(2, "a manifest of parts that is not UTF-8".into()))?;
    let mut parts = Vec::new();
    for (at, line) in text.lines().enumerate() {
        let mut fields = line.splitn(3, ' ');
        let (Some(len), Some(e_tag), Some(relative)) = (fields.next(), fields.next(), fields.next()) else {
            return Err(malformed(at + 2, "a part without a length, an ETag and a name".into()));
        };
        let len =
            len.parse().map_err(|_| malformed(at + 2, format!("a part's length that is not a number: {len:?}")))?;
        parts.push(Part { path: root.join(relative), len, e_tag: e_tag.to_string() });
    }
    if parts.is_empty() {
        return Err(malformed(1, "a manifest that names no part".into()));
    }
    Ok(Some(parts))
}

/// Names parts apart between writers and attempts: the process, the
/// time and a count.
fn attempt_name() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{nanos:x}-{}", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed))
}

/// What a streamed file's content is written to: the first part and the
/// part being filled in memory, the parts between uploaded as they fill.
pub(crate) struct PartWriter<'a> {
    files: &'a ObjectStoreFileManager,
    path: &'a Path,
    part_bytes: usize,
    attempt: String,
    first: Vec<u8>,
    /// The part being filled, when it is not the first.
    current: Vec<u8>,
    /// The index of the part being filled.
    current_index: u64,
    /// Parts 1 to `current_index - 2`, uploaded.
    uploaded: Vec<Part>,
    /// The upload of part `current_index - 1`, under way.
    in_flight: Option<JoinHandle<Result<Part>>>,
    position: u64,
    len: u64,
}

impl<'a> PartWriter<'a> {
    pub(crate) fn new(files: &'a ObjectStoreFileManager, path: &'a Path, part_bytes: usize) -> Self {
        PartWriter {
            files,
            path,
            part_bytes: part_bytes.max(1),
            attempt: attempt_name(),
            first: Vec::new(),
            current: Vec::new(),
            current_index: 0,
            uploaded: Vec::new(),
            in_flight: None,
            position: 0,
            len: 0,
        }
    }

    fn part_path(&self, index: u64) -> PathBuf {
        parts_dir(self.path).join(format!("{}-{index}", self.attempt))
    }

    /// Uploads part `index` holding `bytes`.
    fn upload(&self, index: u64, bytes: Vec<u8>) -> Result<Part> {
        upload_part(self.files, self.part_path(index), bytes)
    }

    /// Waits for the upload under way, if any.
    fn settle_in_flight(&mut self) -> Result<()> {
        let Some(upload) = self.in_flight.take() else { return Ok(()) };
        let part = upload.join().map_err(|_| LogStoreError::ObjectStore {
            op: "put part",
            path: self.path.to_path_buf(),
            message: "the thread uploading a part panicked".into(),
        })??;
        self.uploaded.push(part);
        Ok(())
    }

    /// Moves on to the next part, starting the upload of the one filled
    /// once the one before is up (the first stays until the end).
    fn next_part(&mut self) -> io::Result<()> {
        if self.current_index > 0 {
            self.settle_in_flight().map_err(io::Error::other)?;
            let full = std::mem::take(&mut self.current);
            let (files, path) = (self.files.clone(), self.part_path(self.current_index));
            let upload = std::thread::Builder::new()
                .name("spate-put-part".into())
                .spawn(move || upload_part(&files, path, full))?;
            self.in_flight = Some(upload);
        }
        self.current_index += 1;
        // Its whole size at once, rather than doubled (and copied) up to it.
        self.current.reserve_exact(self.part_bytes);
        Ok(())
    }

    /// Publishes what was written: one put-if-absent of it when it is
    /// within the first part, else the last and first parts' uploads and
    /// the manifest's put-if-absent. Returns the file's length.
    pub(crate) fn publish(mut self, fence: PublishCheck<'_>) -> Result<u64> {
        if self.current_index == 0 {
            fence()?;
            let first = std::mem::take(&mut self.first);
            self.files.put("put-if-absent", self.path, PutPayload::from(first), PutMode::Create)?;
            return Ok(self.len);
        }
        self.settle_in_flight()?;
        let last = std::mem::take(&mut self.current);
        let last = self.upload(self.current_index, last)?;
        let first = std::mem::take(&mut self.first);
        let first = self.upload(0, first)?;
        let mut parts = Vec::with_capacity(self.uploaded.len() + 2);
        parts.push(first);
        parts.append(&mut self.uploaded);
        parts.push(last);
        let manifest = encode_manifest(&parts, self.files.root());
        fence()?;
        self.files.put("put-if-absent", self.path, PutPayload::from(manifest), PutMode::Create)?;
        Ok(self.len)
    }
}

impl Write for PartWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let part_bytes = self.part_bytes as u64;
        let index = self.position / part_bytes;
        if index == self.current_index + 1 && self.position == self.len {
            self.next_part()?;
        }
        let target = match index {
            0 => &mut self.first,
            i if i == self.current_index => &mut self.current,
            _ => return Err(uploaded_already(self.position)),
        };
        let within = usize::try_from(self.position % part_bytes).unwrap_or(usize::MAX);
        if within > target.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a write past the end of a streamed file"));
        }
        let n = buf.len().min(self.part_bytes - within);
        let end = within + n;
        if end > target.len() {
            target.resize(end, 0);
        }
        target[within..end].copy_from_slice(&buf[..n]);
        self.position += n as u64;
        self.len = self.len.max(self.position);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for PartWriter<'_> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let position = match to {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::End(delta) => self.len.checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        let position = position
            .filter(|p| *p <= self.len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a seek outside a streamed file"))?;
        let index = position / self.part_bytes as u64;
        // The end of the file may be where the next part starts.
        if index != 0 && index != self.current_index && position != self.len {
            return Err(uploaded_already(position));
        }
        self.position = position;
        Ok(position)
    }
}

/// Puts part `bytes` at `path`, a key no other write uses.
fn upload_part(files: &ObjectStoreFileManager, path: PathBuf, bytes: Vec<u8>) -> Result<Part> {
    let len = bytes.len() as u64;
    let version = files.put("put part", &path, PutPayload::from(bytes), PutMode::Create)?;
    let FileVersion::Tag(e_tag) = version else { return Err(files.without_etags()) };
    Ok(Part { path, len, e_tag })
}

fn uploaded_already(position: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("offset {position} of a streamed file is in a part already uploaded"),
    )
}
