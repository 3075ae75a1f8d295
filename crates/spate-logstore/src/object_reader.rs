//! An object read as a stream, a range at a time: a state snapshot larger
//! than memory is restored from S3 without being fetched whole.
//!
//! Each range is a conditional GET on the ETag the object had when it was
//! opened, so an object replaced while it is read fails the read rather
//! than mixing two versions (state files are written once; this guards
//! every other use). A file uploaded in parts (see
//! [`crate::object_parts`]) reads as its parts one after another, each
//! range within one part and conditional on the ETag its manifest lists.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange};

use crate::error::LogStoreError;
use crate::object_files::ObjectStoreFileManager;
use crate::object_parts::Part;

/// Bytes the first GET fetches: a chain's files are opened and their
/// headers read before any is restored, so an opened file holds little.
const FIRST_RANGE_BYTES: u64 = 64 << 10;
/// Bytes one GET fetches at most, reached by doubling as the object is read
/// on: a 270 MB snapshot is some 40 requests a pass.
const RANGE_BYTES: u64 = 8 << 20;

/// An object opened for reading (see
/// [`crate::CheckpointFileManager::open_read`]), fetched a range at a time
/// as it is read, each range twice the one before up to `RANGE_BYTES`.
pub(crate) struct ObjectReader {
    files: ObjectStoreFileManager,
    path: PathBuf,
    /// The objects the file is made of, in order: one, or its parts.
    segments: Vec<Segment>,
    len: u64,
    /// Where the next read starts.
    position: u64,
    /// The range fetched last, and where in the object it starts.
    range: Vec<u8>,
    range_start: u64,
    /// The length of the next range fetched.
    next_range: u64,
}

/// One object of a file, and where in the file it starts.
struct Segment {
    key: ObjectPath,
    e_tag: Option<String>,
    start: u64,
    len: u64,
}

impl ObjectReader {
    pub(crate) fn new(
        files: ObjectStoreFileManager,
        path: &Path,
        key: ObjectPath,
        e_tag: Option<String>,
        len: u64,
    ) -> Self {
        Self::of_segments(files, path, vec![Segment { key, e_tag, start: 0, len }])
    }

    /// The file `path` made of `parts`, one after another.
    pub(crate) fn of_parts(files: ObjectStoreFileManager, path: &Path, parts: &[Part]) -> Result<Self, LogStoreError> {
        let mut segments = Vec::with_capacity(parts.len());
        let mut start = 0;
        for part in parts {
            let key = files.key(&part.path)?;
            segments.push(Segment { key, e_tag: Some(part.e_tag.clone()), start, len: part.len });
            start += part.len;
        }
        Ok(Self::of_segments(files, path, segments))
    }

    fn of_segments(files: ObjectStoreFileManager, path: &Path, segments: Vec<Segment>) -> Self {
        let len = segments.last().map_or(0, |s| s.start + s.len);
        ObjectReader {
            files,
            path: path.to_path_buf(),
            segments,
            len,
            position: 0,
            range: Vec::new(),
            range_start: 0,
            next_range: FIRST_RANGE_BYTES,
        }
    }

    /// The fetched bytes from the position on; fetches the range there
    /// when they are not at hand.
    fn at_hand(&mut self) -> io::Result<&[u8]> {
        let fetched = self.range_start..self.range_start + self.range.len() as u64;
        if !fetched.contains(&self.position) {
            self.range = self.fetch(self.position, (self.position + self.next_range).min(self.len))?;
            self.range_start = self.position;
            self.next_range = (self.next_range * 2).min(RANGE_BYTES);
        }
        let from = usize::try_from(self.position - self.range_start).unwrap_or(usize::MAX);
        Ok(self.range.get(from..).unwrap_or_default())
    }

    /// The bytes from `start` to `end`, or to the end of the object
    /// holding `start` when that comes first.
    fn fetch(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
        let segment = self.segments.iter().find(|s| (s.start..s.start + s.len).contains(&start)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: no object holds offset {start}", self.path.display()),
            )
        })?;
        let end = end.min(segment.start + segment.len);
        let (store, key, e_tag) = (self.files.store(), segment.key.clone(), segment.e_tag.clone());
        let range = start - segment.start..end - segment.start;
        let request = move || {
            let (store, key) = (std::sync::Arc::clone(&store), key.clone());
            let options = GetOptions {
                if_match: e_tag.clone(),
                range: Some(GetRange::from(range.clone())),
                ..Default::default()
            };
            async move { store.get_opts(&key, options).await?.bytes().await.map(|bytes| bytes.to_vec()) }
        };
        let bytes = self.files.run("read", &self.path, false, request).map_err(into_io)?;
        if bytes.len() as u64 != end - start {
            let message =
                format!("{}: a range of {} bytes came back with {}", self.path.display(), end - start, bytes.len());
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
        }
        Ok(bytes)
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.position >= self.len || buf.is_empty() {
            return Ok(0);
        }
        let at_hand = self.at_hand()?;
        let n = at_hand.len().min(buf.len());
        buf[..n].copy_from_slice(&at_hand[..n]);
        self.position += n as u64;
        Ok(n)
    }
}

impl Seek for ObjectReader {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let position = match to {
            SeekFrom::Start(offset) => Some(offset),
            SeekFrom::End(delta) => self.len.checked_add_signed(delta),
            SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        self.position = position
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a seek before the start of the object"))?;
        Ok(self.position)
    }
}

/// A store error as the reader reports it.
fn into_io(error: LogStoreError) -> io::Error {
    io::Error::other(error.to_string())
}
