//! [`CheckpointFileManager`] on S3 (any S3-compatible store with
//! conditional writes), through Apache Arrow's `object_store` crate.
//!
//! There is no rename and no copy: a put-if-absent is a PUT with
//! `If-None-Match: *` (`PutMode::Create`), a replace a PUT with `If-Match`
//! on the ETag read before (`PutMode::Update`), so a write is atomic and a
//! racing writer loses instead of overwriting. A store that answers a write
//! without an ETag could only overwrite: it is refused at the first write
//! (the lease, when a writer opens the checkpoint), never used unfenced.
//! There is no conditional delete: a writer's delete checks the lease on
//! the store immediately before the DELETE request. Moving a file (repair's
//! quarantine) is a read, a put-if-absent under the new name, then a delete.
//! A streamed file (a state snapshot) larger than one part is uploaded a
//! part at a time and published by a manifest (see [`crate::object_parts`]).
//! Directories do not exist: a "directory" is a key prefix, and it exists
//! when some object is under it. There are no permissions to tighten and no
//! temp files to clean.
//!
//! The store's client is asynchronous; each call runs on a small runtime
//! owned by the file manager and is waited for, so the checkpoint code stays
//! synchronous and callable from any thread.
//!
//! A store that does not answer (connection refused, reset or timed out
//! after the client's own retries) is waited for up to
//! [`STORE_OUTAGE_LIMIT`]: each failed attempt is a warning and counts in
//! [`STORE_UNAVAILABLE`], and the call goes on once the store is back, so a
//! job outlives a restart of its S3 endpoint. A write is sent again as it
//! is only when it never reached the store (the connection failed). One
//! that may have landed (sent, its answer lost: a connection the pool kept
//! from before the restart fails this way) is not simply repeated, since a
//! second conditional put would be refused by the first: the object is read
//! back, and holding the write's bytes it landed; as it was before, the
//! write is sent again.

use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path as ObjectPath;
use object_store::{
    ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, PutResult, UpdateVersion,
};
use spate_core::{Clock, ReadSeek};

use crate::error::{LogStoreError, Result};
use crate::file_manager::{
    CheckpointFileManager, ContentWriter, FileVersion, LogListing, NO_FENCE, PublishCheck, Tightened,
};
use crate::location::{ObjectStoreSettings, parse_s3_location};
use crate::lock::{LeaseSettings, LockStatus, WriterLock};
use crate::object_parts::{MANIFEST_MAGIC, MAX_MANIFEST_BYTES, PART_BYTES, PartWriter, parse_manifest, parts_dir};
use crate::object_reader::ObjectReader;

/// How long a call waits for a store that does not answer before its error is returned.
pub(crate) const STORE_OUTAGE_LIMIT: Duration = Duration::from_secs(300);
/// The counter of requests that found the store unreachable and were tried again.
pub(crate) const STORE_UNAVAILABLE: &str = "spate_object_store_unavailable_total";
/// Times a conditional write whose answer was lost is read back and sent
/// again before its error is given up to the caller.
const LOST_ANSWER_ATTEMPTS: usize = 5;
/// The first pause before a request is tried again; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Whether a request that failed with `error` is safe to send again and
/// worth it: the store did not answer. `write` requests only when the
/// connection was never made (so the write cannot have landed).
fn is_unreachable(error: &object_store::Error, write: bool) -> bool {
    match http_kind(error) {
        Some(HttpErrorKind::Connect) => true,
        Some(HttpErrorKind::Request | HttpErrorKind::Timeout | HttpErrorKind::Interrupted) => !write,
        _ => false,
    }
}

/// Whether a write that failed with `error` may have landed: it was sent
/// and its answer lost (the connection dropped, as one the pool kept from
/// before a restart of the store does, or the answer timed out).
fn may_have_landed(error: &object_store::Error) -> bool {
    matches!(http_kind(error), Some(HttpErrorKind::Request | HttpErrorKind::Timeout | HttpErrorKind::Interrupted))
}

/// The kind of the HTTP failure behind `error`, if one is.
fn http_kind(error: &object_store::Error) -> Option<HttpErrorKind> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(http) = e.downcast_ref::<HttpError>() {
            return Some(http.kind());
        }
        source = e.source();
    }
    None
}

/// The checkpoint file manager of an `s3://bucket/prefix` location.
#[derive(Clone, Debug)]
pub struct ObjectStoreFileManager {
    inner: Arc<Inner>,
    /// The bytes of a part a streamed file is uploaded in.
    part_bytes: usize,
}

struct Inner {
    /// The location as given (`s3://bucket/prefix`): paths under it map to keys.
    root: PathBuf,
    prefix: Vec<String>,
    store: Arc<dyn ObjectStore>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Inner {
    // Not the client: its configuration holds the credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("root", &self.root)
            .field("prefix", &self.prefix)
            .field("store", &format_args!("{}", self.store))
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropping a runtime blocks; this may run on any thread, including an async one.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl ObjectStoreFileManager {
    /// Connects to the bucket of `location` (`s3://bucket/prefix`) with
    /// `settings` over the AWS environment variables. Nothing is requested
    /// until the first operation.
    pub fn connect(location: &Path, settings: &ObjectStoreSettings) -> Result<Self> {
        let (bucket, prefix) = parse_s3_location(location)?;
        let refuse = |reason: String| LogStoreError::Location { location: location.display().to_string(), reason };
        // The TLS library needs its crypto chosen once per process; a second call finds it chosen.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder =
            AmazonS3Builder::from_env().with_bucket_name(bucket).with_conditional_put(S3ConditionalPut::ETagMatch);
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &settings.region {
            builder = builder.with_region(region);
        }
        if let Some(key) = &settings.access_key_id {
            builder = builder.with_access_key_id(key);
        }
        if let Some(secret) = &settings.secret_access_key {
            builder = builder.with_secret_access_key(secret);
        }
        if let Some(allow) = settings.allow_http {
            builder = builder.with_allow_http(allow);
        }
        let store = builder.build().map_err(|e| refuse(e.to_string()))?;
        Self::with_store(location, &prefix, Arc::new(store))
    }

    /// The file manager of `location` on `store` (the bucket), its keys under
    /// `prefix`: an in-memory store or a `FaultyObjectStore` in tests.
    pub fn with_store(location: &Path, prefix: &str, store: Arc<dyn ObjectStore>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("spate-object-store")
            .enable_all()
            .build()
            .map_err(|e| LogStoreError::Location {
                location: location.display().to_string(),
                reason: format!("cannot start the object store client: {e}"),
            })?;
        let prefix = prefix.split('/').filter(|p| !p.is_empty()).map(str::to_string).collect();
        let root = location.to_path_buf();
        let inner = Arc::new(Inner { root, prefix, store, runtime: Some(runtime) });
        Ok(ObjectStoreFileManager { inner, part_bytes: PART_BYTES })
    }

    /// Uploads a streamed file larger than `bytes` in parts of `bytes`
    /// (8 MiB unless set): what writing one holds in memory is three parts.
    pub fn with_part_bytes(mut self, bytes: usize) -> Self {
        self.part_bytes = bytes.max(1);
        self
    }

    /// The location paths are under.
    pub(crate) fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The object key of `path`, which must be under the location.
    pub(crate) fn key(&self, path: &Path) -> Result<ObjectPath> {
        let relative = path.strip_prefix(&self.inner.root).map_err(|_| LogStoreError::InvalidPath {
            path: path.to_path_buf(),
            reason: "is not under the checkpoint's object store location",
        })?;
        let parts = relative.iter().map(|part| part.to_string_lossy().into_owned());
        Ok(ObjectPath::from_iter(self.inner.prefix.iter().cloned().chain(parts)))
    }

    /// Runs the request `make` makes on the client's runtime and waits for
    /// it, making it again while the store is unreachable (see the module
    /// documentation; `write` for a put).
    pub(crate) fn run<T: Send + 'static, F: Future<Output = object_store::Result<T>> + Send + 'static>(
        &self,
        op: &'static str,
        path: &Path,
        write: bool,
        make: impl Fn() -> F,
    ) -> Result<T> {
        self.run_unmapped(op, path, write, make)?.map_err(|e| store_error(op, path, e))
    }

    /// [`Self::run`] with the store's last error as it is, for a caller
    /// that looks into it.
    fn run_unmapped<T: Send + 'static, F: Future<Output = object_store::Result<T>> + Send + 'static>(
        &self,
        op: &'static str,
        path: &Path,
        write: bool,
        make: impl Fn() -> F,
    ) -> Result<object_store::Result<T>> {
        let deadline = Instant::now() + STORE_OUTAGE_LIMIT;
        let mut pause = FIRST_PAUSE;
        loop {
            match self.run_once(op, path, make())? {
                Err(e) if is_unreachable(&e, write) && Instant::now() + pause < deadline => {
                    metrics::counter!(STORE_UNAVAILABLE).increment(1);
                    tracing::warn!(op, path = %path.display(), error = %e, "the object store is unreachable; retrying");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                result => return Ok(result),
            }
        }
    }

    /// Runs `request` on the client's runtime and waits for it.
    fn run_once<T: Send + 'static>(
        &self,
        op: &'static str,
        path: &Path,
        request: impl Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> Result<object_store::Result<T>> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let runtime = self.inner.runtime.as_ref().ok_or_else(|| stopped(op, path))?;
        runtime.spawn(async move {
            let _ = tx.send(request.await);
        });
        rx.recv().map_err(|_| stopped(op, path))
    }

    pub(crate) fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.inner.store)
    }

    /// The names directly under the prefix of `dir`: objects and "subdirectories".
    fn list_names(&self, dir: &Path) -> Result<Vec<String>> {
        let key = self.key(dir)?;
        let store = self.store();
        let listing = self.run("list", dir, false, || {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { store.list_with_delimiter(Some(&key)).await }
        })?;
        let names = listing.objects.iter().map(|o| &o.location).chain(listing.common_prefixes.iter());
        Ok(names.filter_map(|p| p.filename().map(decode_part)).collect())
    }

    pub(crate) fn put(&self, op: &'static str, path: &Path, payload: PutPayload, mode: PutMode) -> Result<FileVersion> {
        let key = self.key(path)?;
        let store = self.store();
        let options = PutOptions { mode: mode.clone(), ..PutOptions::default() };
        let send = || {
            self.run_unmapped(op, path, true, || {
                let (store, key, payload, options) =
                    (Arc::clone(&store), key.clone(), payload.clone(), options.clone());
                async move { store.put_opts(&key, payload, options).await }
            })
        };
        let e_tag = match send()? {
            Err(e) if may_have_landed(&e) => self.settle_lost_answer(op, path, &payload, &mode, e, send)?,
            other => other.map_err(|e| store_error(op, path, e))?.e_tag,
        };
        e_tag.map(FileVersion::Tag).ok_or_else(|| self.without_etags())
    }

    /// A conditional write whose answer was lost may have landed or not,
    /// and cannot simply be sent again: had it landed, the store would
    /// refuse the repeat. The object is read back instead: holding exactly
    /// `payload`, the write landed; as it was before the write (absent for
    /// a put-if-absent, the expected version for a replace), the write is
    /// sent again (`send`); anything else is what a refused write says.
    /// Returns the ETag of the object written.
    fn settle_lost_answer(
        &self,
        op: &'static str,
        path: &Path,
        payload: &PutPayload,
        mode: &PutMode,
        mut lost: object_store::Error,
        send: impl Fn() -> Result<object_store::Result<PutResult>>,
    ) -> Result<Option<String>> {
        for _ in 0..LOST_ANSWER_ATTEMPTS {
            tracing::warn!(op, path = %path.display(), error = %lost, "a write's answer was lost; reading the object back to see whether it landed");
            let found = self.read_object_versioned(path, crate::checkpoint::MAX_CHECKPOINT_FILE_BYTES)?;
            match (&found, mode) {
                (Some((bytes, FileVersion::Tag(tag))), _) if holds(payload, bytes) => {
                    return Ok(Some(tag.clone()));
                }
                (None, PutMode::Create) => {}
                (Some((_, FileVersion::Tag(tag))), PutMode::Update(expected))
                    if expected.e_tag.as_deref() == Some(tag.as_str()) => {}
                (_, PutMode::Create) => return Err(LogStoreError::AlreadyExists { path: path.to_path_buf() }),
                _ => return Err(LogStoreError::Changed { path: path.to_path_buf() }),
            }
            match send()? {
                Err(e) if may_have_landed(&e) => lost = e,
                other => return other.map(|written| written.e_tag).map_err(|e| store_error(op, path, e)),
            }
        }
        Err(store_error(op, path, lost))
    }

    /// The refusal of a store that answers writes without an ETag: a
    /// replace could then only overwrite, and a stale writer would no longer
    /// be fenced off.
    pub(crate) fn without_etags(&self) -> LogStoreError {
        LogStoreError::Location {
            location: self.inner.root.display().to_string(),
            reason: "the object store answered a write without an ETag, so it cannot replace an object \
                     conditionally (If-Match), which is what keeps a stale writer from overwriting a newer \
                     one's files; use a store that returns ETags and supports conditional writes"
                .to_string(),
        }
    }

    fn head(&self, path: &Path) -> Result<Option<FileVersion>> {
        Ok(self.object_meta(path)?.map(|meta| meta.e_tag.map_or(FileVersion::Unknown, FileVersion::Tag)))
    }

    /// The object at `path` as stored (a manifest of parts as it is) and
    /// its version; `None` when it does not exist.
    fn read_object_versioned(&self, path: &Path, max_len: u64) -> Result<Option<(Vec<u8>, FileVersion)>> {
        let key = self.key(path)?;
        let store = self.store();
        let request = || {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { read_object(store, key, max_len).await }
        };
        match self.run("read", path, false, request) {
            Ok((len, _, None)) => Err(LogStoreError::TooLarge { path: path.to_path_buf(), len, limit: max_len }),
            Ok((_, tag, Some(bytes))) => Ok(Some((bytes, tag.map_or(FileVersion::Unknown, FileVersion::Tag)))),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The first `len` bytes of the object at `path` as stored (fewer when
    /// it is shorter); `None` when it does not exist.
    fn read_object_prefix(&self, path: &Path, len: u64) -> Result<Option<Vec<u8>>> {
        let key = self.key(path)?;
        let store = self.store();
        let request = || {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { store.get_range(&key, 0..len).await.map(|bytes| bytes.to_vec()) }
        };
        match self.run("read", path, false, request) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if is_not_found(&e) => Ok(None),
            // An empty object has no range to read; a whole read says what it is.
            Err(_) => Ok(self.read_object_versioned(path, len)?.map(|(bytes, _)| bytes)),
        }
    }

    /// The file at `path` read through its parts when the object there,
    /// `head` its first bytes, is a manifest of them; `None` when it is not
    /// (or is gone). Refused with [`LogStoreError::TooLarge`] when the file
    /// is longer than `max_len`.
    fn open_parts(&self, path: &Path, head: &[u8], max_len: u64) -> Result<Option<ObjectReader>> {
        if !head.starts_with(MANIFEST_MAGIC) {
            return Ok(None);
        }
        let Some((manifest, _)) = self.read_object_versioned(path, MAX_MANIFEST_BYTES)? else { return Ok(None) };
        self.parts_reader(path, &manifest, max_len)
    }

    /// A reader of the parts `manifest` names; `None` when it is not a manifest.
    fn parts_reader(&self, path: &Path, manifest: &[u8], max_len: u64) -> Result<Option<ObjectReader>> {
        let Some(parts) = parse_manifest(manifest, self.root(), path)? else { return Ok(None) };
        let len = parts.iter().map(|part| part.len).sum();
        if len > max_len {
            return Err(LogStoreError::TooLarge { path: path.to_path_buf(), len, limit: max_len });
        }
        ObjectReader::of_parts(self.clone(), path, &parts).map(Some)
    }

    /// The object's length and ETag; `None` when it does not exist.
    fn object_meta(&self, path: &Path) -> Result<Option<ObjectMeta>> {
        let key = self.key(path)?;
        let store = self.store();
        let request = || {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { store.head(&key).await }
        };
        match self.run("stat", path, false, request) {
            Ok(meta) => Ok(Some(meta)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The name a key's part was made from. [`ObjectPath`] percent-encodes
/// the characters S3 advises against (`[`, `~`, `#`, `%`, …) in each part,
/// and a listing gives the parts as stored: decoded, a listed name joins
/// into a path that maps to the same key again (a state snapshot of an
/// operator called `counts[by word]` can be found, read and purged).
fn decode_part(part: &str) -> String {
    let bytes = part.as_bytes();
    let mut name = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match (byte, bytes.get(at + 1..at + 3).and_then(hex_byte)) {
            (b'%', Some(decoded)) => {
                name.push(decoded);
                at += 3;
            }
            _ => {
                name.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(name).unwrap_or_else(|_| part.to_string())
}

/// The byte two hex digits spell.
fn hex_byte(digits: &[u8]) -> Option<u8> {
    let value = |digit: u8| char::from(digit).to_digit(16);
    match digits {
        [high, low] => Some(u8::try_from(value(*high)? * 16 + value(*low)?).ok()?),
        _ => None,
    }
}

/// The object at `key` with its size and tag; its body only when it is at
/// most `max_len` bytes, so a large object is refused before it is read
/// into memory.
async fn read_object(
    store: Arc<dyn ObjectStore>,
    key: ObjectPath,
    max_len: u64,
) -> object_store::Result<(u64, Option<String>, Option<Vec<u8>>)> {
    let result = store.get(&key).await?;
    let (size, tag) = (result.meta.size, result.meta.e_tag.clone());
    if size > max_len {
        return Ok((size, tag, None));
    }
    Ok((size, tag, Some(result.bytes().await?.to_vec())))
}

/// Whether `bytes` are exactly what `payload` holds.
fn holds(payload: &PutPayload, bytes: &[u8]) -> bool {
    payload.content_length() == bytes.len()
        && payload.iter().try_fold(bytes, |rest, chunk| rest.strip_prefix(chunk.as_ref())).is_some()
}

fn stopped(op: &'static str, path: &Path) -> LogStoreError {
    LogStoreError::ObjectStore { op, path: path.to_path_buf(), message: "the object store client has stopped".into() }
}

/// Maps the store's error: a missing object is `NotFound` (as on a file
/// system), a refused put-if-absent [`LogStoreError::AlreadyExists`], a
/// refused conditional replace [`LogStoreError::Changed`].
fn store_error(op: &'static str, path: &Path, error: object_store::Error) -> LogStoreError {
    let path = path.to_path_buf();
    match error {
        object_store::Error::NotFound { .. } => {
            LogStoreError::Io { op, path, source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such object") }
        }
        object_store::Error::AlreadyExists { .. } => LogStoreError::AlreadyExists { path },
        object_store::Error::Precondition { .. } => LogStoreError::Changed { path },
        other => LogStoreError::ObjectStore { op, path, message: other.to_string() },
    }
}

fn is_not_found(error: &LogStoreError) -> bool {
    matches!(error, LogStoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

impl CheckpointFileManager for ObjectStoreFileManager {
    fn list(&self, dir: &Path) -> Result<Vec<String>> {
        self.list_names(dir)
    }

    fn read(&self, path: &Path, max_len: u64) -> Result<Option<Vec<u8>>> {
        Ok(self.read_versioned(path, max_len)?.map(|(bytes, _)| bytes))
    }

    fn read_prefix(&self, path: &Path, len: u64) -> Result<Option<Vec<u8>>> {
        if len == 0 {
            return Ok(self.exists(path)?.then(Vec::new));
        }
        // Enough to tell a manifest of parts.
        let Some(mut head) = self.read_object_prefix(path, len.max(MANIFEST_MAGIC.len() as u64))? else {
            return Ok(None);
        };
        if let Some(mut parts) = self.open_parts(path, &head, u64::MAX)? {
            head.clear();
            parts.by_ref().take(len).read_to_end(&mut head).map_err(|e| LogStoreError::io("read", path, e))?;
        }
        head.truncate(usize::try_from(len).unwrap_or(usize::MAX));
        Ok(Some(head))
    }

    /// Opened as an [`ObjectReader`]: the object is fetched a range at a
    /// time as it is read, each range conditional on the ETag it had when
    /// opened.
    fn open_read(&self, path: &Path, max_len: u64) -> Result<Option<Box<dyn ReadSeek>>> {
        let Some(meta) = self.object_meta(path)? else { return Ok(None) };
        // A manifest is small: only a small object's first bytes are looked at.
        if (MANIFEST_MAGIC.len() as u64..=MAX_MANIFEST_BYTES).contains(&meta.size)
            && let Some(head) = self.read_object_prefix(path, MANIFEST_MAGIC.len() as u64)?
            && let Some(parts) = self.open_parts(path, &head, max_len)?
        {
            return Ok(Some(Box::new(parts)));
        }
        if meta.size > max_len {
            return Err(LogStoreError::TooLarge { path: path.to_path_buf(), len: meta.size, limit: max_len });
        }
        let key = self.key(path)?;
        Ok(Some(Box::new(ObjectReader::new(self.clone(), path, key, meta.e_tag, meta.size))))
    }

    /// A file uploaded in parts is read whole, its parts one after another.
    fn read_versioned(&self, path: &Path, max_len: u64) -> Result<Option<(Vec<u8>, FileVersion)>> {
        let Some((bytes, version)) = self.read_object_versioned(path, max_len)? else { return Ok(None) };
        let Some(mut parts) = self.parts_reader(path, &bytes, max_len)? else { return Ok(Some((bytes, version))) };
        let mut content = Vec::new();
        parts.read_to_end(&mut content).map_err(|e| LogStoreError::io("read", path, e))?;
        Ok(Some((content, version)))
    }

    fn create_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        fence()?;
        self.put("put-if-absent", path, PutPayload::from(bytes.to_vec()), PutMode::Create).map(|_| ())
    }

    /// Uploaded a part at a time once larger than one (see
    /// [`crate::object_parts`]): three parts in memory, not the file.
    fn create_atomic_streamed(&self, path: &Path, content: ContentWriter<'_>, fence: PublishCheck<'_>) -> Result<u64> {
        let mut writer = PartWriter::new(self, path, self.part_bytes);
        content(&mut writer).map_err(|e| LogStoreError::io("write", path, e))?;
        writer.publish(fence)
    }

    fn replace_atomic(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<()> {
        let expected = self.head(path)?.unwrap_or(FileVersion::Absent);
        self.replace_if_unchanged(path, bytes, &expected, fence).map(|_| ())
    }

    fn replace_if_unchanged(
        &self,
        path: &Path,
        bytes: &[u8],
        expected: &FileVersion,
        fence: PublishCheck<'_>,
    ) -> Result<FileVersion> {
        let mode = match expected {
            FileVersion::Absent => PutMode::Create,
            FileVersion::Tag(tag) => PutMode::Update(UpdateVersion { e_tag: Some(tag.clone()), version: None }),
            // Read without an ETag: refused rather than overwritten.
            FileVersion::Unknown => return Err(self.without_etags()),
        };
        fence()?;
        match self.put("conditional put", path, PutPayload::from(bytes.to_vec()), mode) {
            // Put-if-absent on a replace: the file appeared since it was read.
            Err(LogStoreError::AlreadyExists { path }) if *expected == FileVersion::Absent => {
                Err(LogStoreError::Changed { path })
            }
            other => other,
        }
    }

    fn rename_no_replace(&self, from: &Path, to: &Path, fence: PublishCheck<'_>) -> Result<()> {
        let Some(bytes) = self.read(from, crate::checkpoint::MAX_CHECKPOINT_FILE_BYTES)? else {
            let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such object");
            return Err(LogStoreError::io("move", from, missing));
        };
        // In parts again when it was (the parts belong to the old name).
        self.create_atomic_streamed(to, &mut |out| out.write_all(&bytes), fence)?;
        self.delete_streamed(from, fence).map(|_| ())
    }

    fn delete(&self, path: &Path) -> Result<bool> {
        self.delete_fenced(path, NO_FENCE)
    }

    /// There is no conditional delete: `fence` runs after the HEAD,
    /// immediately before the DELETE request.
    fn delete_fenced(&self, path: &Path, fence: PublishCheck<'_>) -> Result<bool> {
        if self.head(path)?.is_none() {
            return Ok(false);
        }
        fence()?;
        let key = self.key(path)?;
        let store = self.store();
        self.run("delete", path, false, || {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { store.delete(&key).await }
        })?;
        Ok(true)
    }

    /// The object, then every part under `<name>.parts/`: those its
    /// manifest named and any an upload that never published left.
    fn delete_streamed(&self, path: &Path, fence: PublishCheck<'_>) -> Result<bool> {
        let deleted = self.delete_fenced(path, fence)?;
        let dir = parts_dir(path);
        for (relative, _) in self.list_files_recursive(&dir)? {
            self.delete_fenced(&dir.join(relative), fence)?;
        }
        Ok(deleted)
    }

    fn exists(&self, path: &Path) -> Result<bool> {
        if self.head(path)?.is_some() {
            return Ok(true);
        }
        // A "directory": some object under the prefix.
        let key = self.key(path)?;
        let store = self.store();
        let first = self.run("list", path, false, || {
            let (store, key) = (Arc::clone(&store), key.clone());
            async move { store.list(Some(&key)).try_next().await }
        })?;
        Ok(first.is_some())
    }

    fn mkdirs(&self, _dir: &Path) -> Result<()> {
        Ok(())
    }

    fn list_log(&self, dir: &Path) -> Result<LogListing> {
        let mut listing = LogListing::default();
        for name in self.list_names(dir)? {
            listing.add(name.as_bytes());
        }
        Ok(listing)
    }

    fn tighten_permissions(&self, _dir: &Path) -> Result<Vec<Tightened>> {
        Ok(Vec::new())
    }

    fn clean_temp_files(&self, _dir: &Path) -> Result<usize> {
        Ok(0)
    }

    /// A conditional replace of the whole object: an object cannot grow in place.
    fn append(&self, path: &Path, bytes: &[u8], fence: PublishCheck<'_>) -> Result<u64> {
        let (mut content, version) = self
            .read_versioned(path, crate::checkpoint::MAX_CHECKPOINT_FILE_BYTES)?
            .unwrap_or((Vec::new(), FileVersion::Absent));
        content.extend_from_slice(bytes);
        self.replace_if_unchanged(path, &content, &version, fence)?;
        Ok(content.len() as u64)
    }

    fn list_files_recursive(&self, dir: &Path) -> Result<Vec<(PathBuf, u64)>> {
        let key = self.key(dir)?;
        let store = self.store();
        let prefix_key = key.clone();
        let objects = self.run("list", dir, false, || {
            let (store, key) = (Arc::clone(&store), prefix_key.clone());
            async move { store.list(Some(&key)).try_collect::<Vec<_>>().await }
        })?;
        Ok(objects
            .into_iter()
            .filter_map(|meta| {
                let relative: PathBuf =
                    meta.location.prefix_match(&key)?.map(|part| decode_part(part.as_ref())).collect();
                Some((relative, meta.size))
            })
            .collect())
    }

    fn acquire_lock(&self, dir: &Path, clock: Arc<dyn Clock>, lease: &LeaseSettings) -> Result<WriterLock> {
        crate::lease::acquire(Arc::new(self.clone()), dir, clock, lease)
    }

    fn lock_status(&self, dir: &Path, clock: &dyn Clock) -> LockStatus {
        crate::lease::status(self, dir, clock)
    }

    fn is_object_store(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use spate_core::{BatchId, Duration, ManualClock, Time};

    use super::*;
    use crate::file_manager::NO_FENCE;
    use crate::{Checkpoint, CheckpointSettings, CommitMetadata, FaultyObjectStore, ObjectFault, OffsetSeq};

    const LOCATION: &str = "s3://bucket/ck";
    const START: i64 = 1_700_000_000_000;

    fn files() -> ObjectStoreFileManager {
        ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", Arc::new(InMemory::new())).unwrap()
    }

    #[test]
    fn a_prefix_is_read_without_the_rest_of_the_object() {
        let files = files();
        let path = Path::new(LOCATION).join("state/op/3");
        files.create_atomic(&path, b"0123456789", NO_FENCE).unwrap();
        assert_eq!(files.read_prefix(&path, 4).unwrap().unwrap(), b"0123");
        assert_eq!(files.read_prefix(&path, 17).unwrap().unwrap(), b"0123456789", "a short object is read whole");
        let empty = Path::new(LOCATION).join("state/op/4");
        files.create_atomic(&empty, b"", NO_FENCE).unwrap();
        assert_eq!(files.read_prefix(&empty, 17).unwrap().unwrap(), b"");
        assert_eq!(files.read_prefix(&empty, 0).unwrap().unwrap(), b"");
        assert_eq!(files.read_prefix(&Path::new(LOCATION).join("state/op/5"), 17).unwrap(), None);
    }

    #[test]
    fn an_opened_object_reads_as_the_object_a_range_at_a_time_and_seeks() {
        use std::io::{Read, Seek, SeekFrom};
        let files = files();
        let path = Path::new(LOCATION).join("state/op/3");
        // Ranges of 64 KiB doubling to 8 MiB, another of 8 MiB and a part.
        let bytes: Vec<u8> = (0..(25u32 << 20)).map(|i| (i % 253) as u8).collect();
        files.create_atomic(&path, &bytes, NO_FENCE).unwrap();
        let mut streamed = Vec::new();
        files.open_read(&path, u64::MAX).unwrap().unwrap().read_to_end(&mut streamed).unwrap();
        assert!(streamed == bytes, "the streamed object differs");
        let mut reader = files.open_read(&path, u64::MAX).unwrap().unwrap();
        let mut four = [0u8; 4];
        for at in [SeekFrom::Start(17 << 20), SeekFrom::Current(-(9 << 20)), SeekFrom::End(-4), SeekFrom::Start(3)] {
            let position = reader.seek(at).unwrap() as usize;
            reader.read_exact(&mut four).unwrap();
            assert_eq!(four, bytes[position..position + 4], "{at:?}");
        }
        assert_eq!(reader.seek(SeekFrom::End(10)).unwrap(), bytes.len() as u64 + 10);
        assert_eq!(reader.read(&mut four).unwrap(), 0, "past the end nothing is read");
        assert!(reader.seek(SeekFrom::Current(-(40 << 20))).is_err(), "before the start");
        assert!(files.open_read(&Path::new(LOCATION).join("state/op/5"), u64::MAX).unwrap().is_none());
        let err = files.open_read(&path, 1 << 20).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("exceeds the limit"), "{err}");
    }

    #[test]
    fn an_object_replaced_while_it_is_read_fails_the_read() {
        use std::io::{Read, Seek, SeekFrom};
        let files = files();
        let path = Path::new(LOCATION).join("graph");
        files.create_atomic(&path, &vec![1u8; 10 << 20], NO_FENCE).unwrap();
        let mut reader = files.open_read(&path, u64::MAX).unwrap().unwrap();
        let mut one = [0u8; 1];
        reader.read_exact(&mut one).unwrap();
        files.replace_atomic(&path, &vec![2u8; 10 << 20], NO_FENCE).unwrap();
        // The first range is at hand; the next is fetched from the new object.
        reader.seek(SeekFrom::Start(9 << 20)).unwrap();
        assert!(reader.read_exact(&mut one).is_err(), "a range of another version was read: {one:?}");
    }

    #[test]
    fn a_streamed_object_is_one_put_if_absent_of_what_was_written() {
        let files = files();
        let path = Path::new(LOCATION).join("state/op/3");
        // A header filled in last, as a streamed frame writes it.
        let mut content = |out: &mut dyn spate_core::SeekWrite| {
            out.write_all(b"....payload")?;
            out.seek(std::io::SeekFrom::Start(0))?;
            out.write_all(b"HEAD")?;
            out.seek(std::io::SeekFrom::End(0)).map(drop)
        };
        assert_eq!(files.create_atomic_streamed(&path, &mut content, NO_FENCE).unwrap(), 11);
        assert_eq!(files.read(&path, 100).unwrap().unwrap(), b"HEADpayload");
        let again = files.create_atomic_streamed(&path, &mut content, NO_FENCE);
        assert!(matches!(again, Err(LogStoreError::AlreadyExists { .. })), "{again:?}");
    }

    /// Writes `len` bytes as a streamed frame does (a header filled in
    /// last, seeking back to the start) to a manager on `store` with
    /// parts of 1,000 bytes; `during` is called once 3,500 bytes (or all)
    /// are written. Returns what was written.
    fn write_in_parts(
        files: &ObjectStoreFileManager,
        path: &Path,
        len: usize,
        during: &mut dyn FnMut(),
    ) -> (Vec<u8>, Result<u64>) {
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut expected = bytes.clone();
        expected[..4].copy_from_slice(b"HEAD");
        let split = len.min(3500);
        let mut content = |out: &mut dyn spate_core::SeekWrite| {
            out.write_all(&bytes[..split])?;
            during();
            out.write_all(&bytes[split..])?;
            out.seek(std::io::SeekFrom::Start(0))?;
            out.write_all(b"HEAD")?;
            out.seek(std::io::SeekFrom::End(0)).map(drop)
        };
        let written = files.create_atomic_streamed(path, &mut content, NO_FENCE);
        (expected, written)
    }

    fn parted_files(store: Arc<dyn ObjectStore>) -> ObjectStoreFileManager {
        ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", store).unwrap().with_part_bytes(1000)
    }

    /// The objects under the location, relative to it.
    fn objects(files: &ObjectStoreFileManager) -> Vec<String> {
        let mut names: Vec<String> = files
            .list_files_recursive(Path::new(LOCATION))
            .unwrap()
            .into_iter()
            .map(|(path, _)| path.display().to_string())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_streamed_file_beyond_one_part_is_uploaded_as_it_is_written_and_reads_as_written() {
        use std::io::{Read, Seek, SeekFrom};
        let files = parted_files(Arc::new(InMemory::new()));
        let path = Path::new(LOCATION).join("state/op/3");
        let mut uploaded_while_writing = Vec::new();
        let (expected, written) =
            write_in_parts(&files, &path, 4500, &mut || uploaded_while_writing = objects(&parted_files_view(&files)));
        assert_eq!(written.unwrap(), 4500);
        // Part 1 was up before part 2's upload began; part 0 waits for its
        // header, and nothing is published.
        let (mut one, mut early) = (false, false);
        for name in &uploaded_while_writing {
            one |= name.starts_with("state/op/3.parts/") && name.ends_with("-1");
            early |= name.ends_with("-0") || name == "state/op/3";
        }
        assert!(one && !early, "{uploaded_while_writing:?}");
        let names = objects(&files);
        assert_eq!(names.len(), 6, "the manifest and five parts: {names:?}");
        let raw = files.read_object_versioned(&path, 1 << 20).unwrap().unwrap().0;
        assert!(raw.starts_with(MANIFEST_MAGIC), "{}", String::from_utf8_lossy(&raw));

        assert!(files.read(&path, 1 << 20).unwrap().unwrap() == expected, "read whole");
        assert_eq!(files.read_prefix(&path, 4).unwrap().unwrap(), b"HEAD");
        assert!(files.read_prefix(&path, 2100).unwrap().unwrap() == expected[..2100], "a prefix over two parts");
        let mut streamed = Vec::new();
        files.open_read(&path, 1 << 20).unwrap().unwrap().read_to_end(&mut streamed).unwrap();
        assert!(streamed == expected, "read as a stream");
        let mut reader = files.open_read(&path, 1 << 20).unwrap().unwrap();
        let mut four = [0u8; 4];
        for at in [SeekFrom::Start(2998), SeekFrom::Start(997), SeekFrom::End(-4), SeekFrom::Start(0)] {
            let position = reader.seek(at).unwrap() as usize;
            reader.read_exact(&mut four).unwrap();
            assert_eq!(four, expected[position..position + 4], "{at:?}");
        }
        let refused = files.open_read(&path, 4499).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("exceeds the limit"), "the file's length counts, not the manifest's: {refused}");

        let again = write_in_parts(&files, &path, 4500, &mut || {}).1;
        assert!(matches!(again, Err(LogStoreError::AlreadyExists { .. })), "{again:?}");
        assert!(files.delete_streamed(&path, NO_FENCE).unwrap());
        assert_eq!(objects(&files), Vec::<String>::new(), "the parts go with the file, the refused upload's too");
    }

    /// Another manager on the same store, to look while one writes.
    fn parted_files_view(files: &ObjectStoreFileManager) -> ObjectStoreFileManager {
        parted_files(files.store())
    }

    #[test]
    fn a_streamed_file_within_one_part_is_one_object() {
        let files = parted_files(Arc::new(InMemory::new()));
        let path = Path::new(LOCATION).join("state/op/3");
        let (expected, written) = write_in_parts(&files, &path, 1000, &mut || {});
        assert_eq!(written.unwrap(), expected.len() as u64);
        assert_eq!(objects(&files), ["state/op/3"]);
        assert!(files.read(&path, 1 << 20).unwrap().unwrap() == expected);
    }

    #[test]
    fn a_streamed_file_cannot_seek_back_into_a_part_uploaded() {
        let files = parted_files(Arc::new(InMemory::new()));
        let path = Path::new(LOCATION).join("state/op/3");
        let mut content = |out: &mut dyn spate_core::SeekWrite| {
            out.write_all(&[7u8; 2500])?;
            out.seek(std::io::SeekFrom::Start(1500)).map(drop)
        };
        let refused = files.create_atomic_streamed(&path, &mut content, NO_FENCE);
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("already uploaded"), "{message}");
        assert_eq!(files.read(&path, 1 << 20).unwrap(), None, "nothing is published");
    }

    #[test]
    fn a_part_changed_after_publishing_fails_the_read() {
        use std::io::Read;
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let files = parted_files(Arc::clone(&store));
        let path = Path::new(LOCATION).join("state/op/3");
        write_in_parts(&files, &path, 3500, &mut || {}).1.unwrap();
        let part = objects(&files).into_iter().find(|name| name.ends_with("-2")).unwrap();
        files.replace_atomic(&Path::new(LOCATION).join(part), &[0u8; 1000], NO_FENCE).unwrap();
        let mut out = Vec::new();
        assert!(files.open_read(&path, 1 << 20).unwrap().unwrap().read_to_end(&mut out).is_err(), "read another part");
        assert!(files.read(&path, 1 << 20).is_err());
    }

    #[test]
    fn a_manifest_that_does_not_parse_is_an_error_naming_the_file() {
        let files = parted_files(Arc::new(InMemory::new()));
        let path = Path::new(LOCATION).join("state/op/3");
        let mut manifest = MANIFEST_MAGIC.to_vec();
        manifest.extend_from_slice(b"ten \"etag\" state/op/3.parts/a-0\n");
        files.create_atomic(&path, &manifest, NO_FENCE).unwrap();
        let err = files.read(&path, 1 << 20).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("state/op/3") && err.contains("line 2") && err.contains("not a number"), "{err}");
    }

    #[test]
    fn a_crash_at_any_write_of_a_streamed_file_leaves_it_absent_and_a_rewrite_whole() {
        let path = Path::new(LOCATION).join("state/op/3");
        // Four parts and the manifest.
        for n in 0..5 {
            let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
            let store = Arc::new(FaultyObjectStore::fail_write(Arc::clone(&inner), n, ObjectFault::BeforeApply, true));
            let crashed = write_in_parts(&parted_files(store.clone()), &path, 3500, &mut || {}).1;
            assert!(crashed.is_err() && store.fired(), "write {n}");
            let files = parted_files(inner);
            assert_eq!(files.read(&path, 1 << 20).unwrap(), None, "write {n}: a file with parts missing");
            let (expected, written) = write_in_parts(&files, &path, 3500, &mut || {});
            written.unwrap();
            assert!(files.read(&path, 1 << 20).unwrap().unwrap() == expected, "write {n}");
            files.delete_streamed(&path, NO_FENCE).unwrap();
            assert_eq!(objects(&files), Vec::<String>::new(), "write {n}: the crashed upload's parts are left");
        }
    }

    #[test]
    fn a_write_whose_connection_dropped_is_read_back_and_found_landed_or_sent_again() {
        let path = Path::new(LOCATION).join("offsets/3");
        for fault in [ObjectFault::DroppedBeforeApply, ObjectFault::DroppedAfterApply] {
            // A put-if-absent (a log entry), the first write.
            let store = Arc::new(FaultyObjectStore::fail_write(Arc::new(InMemory::new()), 0, fault, false));
            let files = files_on(store.clone());
            files.create_atomic(&path, b"entry 3", NO_FENCE).unwrap();
            assert!(store.fired(), "{fault:?}");
            assert_eq!(files.read(&path, 100).unwrap().unwrap(), b"entry 3", "{fault:?}");
            // Sent again only when it had not landed.
            let sent = if fault == ObjectFault::DroppedBeforeApply { 2 } else { 1 };
            assert_eq!(store.writes(), sent, "{fault:?}");

            // A conditional replace (the LOCK, `graph`), the second write.
            let store = Arc::new(FaultyObjectStore::fail_write(Arc::new(InMemory::new()), 1, fault, false));
            let files = files_on(store.clone());
            files.create_atomic(&path, b"old", NO_FENCE).unwrap();
            let expected = files.read_versioned(&path, 100).unwrap().unwrap().1;
            let now = files.replace_if_unchanged(&path, b"new", &expected, NO_FENCE).unwrap();
            let (bytes, version) = files.read_versioned(&path, 100).unwrap().unwrap();
            assert_eq!((bytes.as_slice(), &version), (&b"new"[..], &now), "{fault:?}");
        }
    }

    #[test]
    fn a_write_whose_connection_dropped_finding_another_object_there_is_refused() {
        let path = Path::new(LOCATION).join("offsets/3");
        // Another writer's entry is there: the put-if-absent did not land.
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        files_on(Arc::clone(&inner)).create_atomic(&path, b"theirs", NO_FENCE).unwrap();
        let store = Arc::new(FaultyObjectStore::fail_write(inner, 0, ObjectFault::DroppedBeforeApply, false));
        let files = files_on(store.clone());
        let refused = files.create_atomic(&path, b"ours", NO_FENCE);
        assert!(matches!(refused, Err(LogStoreError::AlreadyExists { .. })), "{refused:?}");
        assert_eq!(files.read(&path, 100).unwrap().unwrap(), b"theirs");
        // A replace that finds a version other than the one it expected.
        let stale = files.read_versioned(&path, 100).unwrap().unwrap().1;
        files.replace_if_unchanged(&path, b"newer", &stale, NO_FENCE).unwrap();
        let store = Arc::new(FaultyObjectStore::fail_write(store, 0, ObjectFault::DroppedBeforeApply, false));
        let refused = files_on(store).replace_if_unchanged(&path, b"ours", &stale, NO_FENCE);
        assert!(matches!(refused, Err(LogStoreError::Changed { .. })), "{refused:?}");
    }

    #[test]
    fn a_connected_file_manager_prints_no_credential() {
        let settings = ObjectStoreSettings {
            endpoint: Some("http://127.0.0.1:1".into()),
            region: Some("us-east-1".into()),
            access_key_id: Some("AKIAEXAMPLEKEYID".into()),
            secret_access_key: Some("hunter2".into()),
            allow_http: Some(true),
        };
        let files = ObjectStoreFileManager::connect(Path::new(LOCATION), &settings).unwrap();
        let printed = format!("{files:?}");
        assert!(!printed.contains("AKIAEXAMPLEKEYID") && !printed.contains("hunter2"), "{printed}");
        assert!(printed.contains(LOCATION), "{printed}");
    }

    #[test]
    fn names_a_key_must_percent_encode_are_listed_as_written_so_they_can_be_used_again() {
        let files = files();
        let state = Path::new(LOCATION).join("state");
        let names = ["counts[by word]", "top~10 #1", "100%", "a%41", "plain"];
        for name in names {
            files.create_atomic(&state.join(name).join("7"), b"snapshot", NO_FENCE).unwrap();
        }
        let mut listed = files.list(&state).unwrap();
        listed.sort();
        let mut expected: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        expected.sort();
        assert_eq!(listed, expected);
        let mut recursive: Vec<PathBuf> =
            files.list_files_recursive(&state).unwrap().into_iter().map(|f| f.0).collect();
        recursive.sort();
        assert_eq!(recursive, expected.iter().map(|n| Path::new(n).join("7")).collect::<Vec<_>>());
        for name in listed {
            assert_eq!(files.list(&state.join(&name)).unwrap(), ["7"], "{name}");
            assert!(files.delete(&state.join(&name).join("7")).unwrap(), "{name}");
        }
        assert!(files.list(&state).unwrap().is_empty());
    }

    fn files_on(store: Arc<dyn ObjectStore>) -> Arc<dyn CheckpointFileManager> {
        Arc::new(ObjectStoreFileManager::with_store(Path::new(LOCATION), "ck", store).unwrap())
    }

    fn options(files: &Arc<dyn CheckpointFileManager>, clock: &Arc<ManualClock>) -> CheckpointSettings {
        let lease = LeaseSettings { renew_in_background: false, ..LeaseSettings::default() };
        CheckpointSettings::new().with_clock(clock.clone()).with_file_manager(Arc::clone(files)).with_lease(lease)
    }

    #[test]
    fn a_store_without_etags_is_refused_at_start_naming_it_and_why() {
        let files = files_on(Arc::new(FaultyObjectStore::without_etags(Arc::new(InMemory::new()))));
        let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        let err = Checkpoint::open_for_write(LOCATION, options(&files, &clock)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, LogStoreError::Location { .. }), "{text}");
        assert!(text.contains(LOCATION) && text.contains("ETag") && text.contains("conditional"), "{text}");

        // Never a plain overwrite in place of a conditional replace.
        let path = Path::new(LOCATION).join("graph");
        let created = files.create_atomic(&path, b"first", NO_FENCE); // lands, but is answered without an ETag
        assert!(matches!(created, Err(LogStoreError::Location { .. })), "{created:?}");
        let replaced = files.replace_if_unchanged(&path, b"second", &FileVersion::Unknown, NO_FENCE);
        assert!(matches!(replaced, Err(LogStoreError::Location { .. })), "{replaced:?}");
        assert_eq!(files.read(&path, 1024).unwrap().unwrap(), b"first");
    }

    #[test]
    fn a_log_entry_is_one_put_if_absent_and_an_existing_one_is_kept() {
        let store = Arc::new(FaultyObjectStore::new(Arc::new(InMemory::new())));
        let files = files_on(store.clone());
        let clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        let checkpoint = Checkpoint::open_for_write(LOCATION, options(&files, &clock)).unwrap();
        let (reads, writes) = (store.reads(), store.writes());
        assert!(checkpoint.offsets().add(BatchId(0), &OffsetSeq::default()).unwrap());
        assert!(checkpoint.commits().add(BatchId(0), &CommitMetadata::default()).unwrap());
        // No HEAD or LIST before the PUT: its If-None-Match is the check.
        assert_eq!((store.reads() - reads, store.writes() - writes), (0, 2));

        // Refused by the store, never overwritten; read once to see which writer wrote it.
        let other = OffsetSeq { batch_timestamp: Time::from_millis(START), ..OffsetSeq::default() };
        assert!(!checkpoint.offsets().add(BatchId(0), &other).unwrap());
        assert_eq!(checkpoint.offsets().get(BatchId(0)).unwrap(), Some(OffsetSeq::default()));
    }

    #[test]
    fn a_stale_writers_purge_and_deletes_cannot_land() {
        let files = files_on(Arc::new(InMemory::new()));
        // The old writer is paused: its clock stands still, so its lease looks alive to it.
        let old_clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        let old = Checkpoint::open_for_write(LOCATION, options(&files, &old_clock)).unwrap();
        for n in 0..3 {
            assert!(old.offsets().add(BatchId(n), &OffsetSeq::default()).unwrap());
            assert!(old.commit_batch(BatchId(n), &CommitMetadata::default()).unwrap());
        }
        old.write_file("state/op/0", b"state").unwrap();

        let new_clock = Arc::new(ManualClock::new(Time::from_millis(START)));
        new_clock.advance(Duration::from_millis(60_000));
        let new = Checkpoint::open_for_write(LOCATION, options(&files, &new_clock)).unwrap();
        let stale = |e: LogStoreError| assert!(matches!(e, LogStoreError::StaleEpoch { ours: 1, .. }), "{e}");
        stale(old.offsets().purge(BatchId(2)).unwrap_err());
        stale(old.commits().purge(BatchId(2)).unwrap_err());
        stale(old.delete_file("state/op/0").unwrap_err());
        assert_eq!(new.offsets().ids().unwrap(), [BatchId(0), BatchId(1), BatchId(2)]);
        assert_eq!(new.commits().ids().unwrap(), [BatchId(0), BatchId(1), BatchId(2)]);
        assert_eq!(new.read_file("state/op/0").unwrap().unwrap(), b"state");
        // The new writer purges as it should.
        assert_eq!(new.offsets().purge(BatchId(2)).unwrap(), 2);
        assert!(new.delete_file("state/op/0").unwrap());
    }
}
