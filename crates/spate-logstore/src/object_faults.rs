//! Fault injection for checkpoints in an object store: [`FaultyObjectStore`]
//! wraps any `object_store` store and makes one chosen write request fail,
//! either before the store applies it or after (the write landed but its
//! answer was lost, as when a connection drops; or the client sent it again
//! and got the answer to the repeat), and then, if asked, fails every later
//! request as if the process had died there. It can also hold one write
//! until the test lets it go (a slow store), and answer without ETags, as
//! some S3-compatible stores do.
//!
//! Counting only writes (put, delete, copy) makes "crash at every step" a
//! loop over one number, as [`crate::FaultyFileManager`] does for files.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use async_trait::async_trait;
use futures::StreamExt;
use futures::channel::oneshot;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use spate_core::sync::lock;

/// When the chosen write fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFault {
    /// The request is refused before the store applies it.
    BeforeApply,
    /// The store applies it, then the caller gets an error.
    AfterApply,
    /// The store applies it, its answer is lost, and the request is sent
    /// again, as a client does when a connection drops: the caller gets the
    /// answer to the repeat (a conditional put is then refused as a conflict).
    AfterApplyRetried,
    /// The connection drops after the request is sent and before the store
    /// applies it: the caller gets an HTTP request error, as for a
    /// connection the pool kept from before a restart of the store, and
    /// cannot tell whether the write landed.
    DroppedBeforeApply,
    /// The store applies it, then the connection drops before its answer:
    /// the caller gets the same HTTP request error.
    DroppedAfterApply,
}

/// An object store that fails its `n`-th write (0-based); see the module docs.
#[derive(Debug)]
pub struct FaultyObjectStore {
    inner: Arc<dyn ObjectStore>,
    faults: Arc<Faults>,
}

#[derive(Debug, Default)]
struct Faults {
    fail_at: Option<(usize, ObjectFault)>,
    crash: bool,
    /// Answers carry no ETag.
    without_etags: bool,
    /// The write to hold, who to tell when it arrives, and what lets it go.
    held: Mutex<Option<Hold>>,
    writes: AtomicUsize,
    /// Reads (GET, HEAD) and listings requested, counted to check what a step costs.
    reads: AtomicUsize,
    fired: AtomicBool,
    /// The object the failed write was for.
    fired_on: Mutex<Option<String>>,
}

/// The number of the write to hold, who to tell when it arrives, and what lets it go.
type Hold = (usize, mpsc::Sender<()>, oneshot::Receiver<()>);

/// A write held before it reaches the store until [`HeldWrite::release`]
/// (or until this handle is dropped): a store that is slow to answer.
#[derive(Debug)]
pub struct HeldWrite {
    reached: Mutex<mpsc::Receiver<()>>,
    release: Mutex<Option<oneshot::Sender<()>>>,
}

impl HeldWrite {
    /// Blocks until the held write has been requested (and is waiting).
    pub fn wait_until_reached(&self) {
        let _ = lock(&self.reached).recv();
    }

    /// Lets the held write go on to the store.
    pub fn release(&self) {
        if let Some(release) = lock(&self.release).take() {
            let _ = release.send(());
        }
    }
}

fn injected(location: &Path) -> object_store::Error {
    let source = format!("injected fault writing {location}").into();
    object_store::Error::Generic { store: "FaultyObjectStore", source }
}

/// What a client reports when the connection of a sent request drops.
fn dropped(location: &Path) -> object_store::Error {
    let reset = std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        format!("injected: connection dropped writing {location}"),
    );
    let source = Box::new(object_store::client::HttpError::new(object_store::client::HttpErrorKind::Request, reset));
    object_store::Error::Generic { store: "FaultyObjectStore", source }
}

impl Faults {
    /// [`Faults::alive`] for a read or a listing, which it counts.
    fn alive_to_read(&self, location: &Path) -> object_store::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.alive(location)
    }

    /// Refused once the process has "died".
    fn alive(&self, location: &Path) -> object_store::Result<()> {
        if self.crash && self.fired.load(Ordering::SeqCst) { Err(injected(location)) } else { Ok(()) }
    }

    /// Runs one write (`request` sends it), failing it when it is the chosen one.
    async fn write<T, F>(&self, location: &Path, request: impl Fn() -> F) -> object_store::Result<T>
    where
        F: Future<Output = object_store::Result<T>>,
    {
        self.alive(location)?;
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        self.hold_if_chosen(n).await;
        match self.fail_at {
            Some((at, fault)) if at == n => {
                self.fired.store(true, Ordering::SeqCst);
                *lock(&self.fired_on) = Some(location.to_string());
                match fault {
                    ObjectFault::BeforeApply => Err(injected(location)),
                    // Applied; only the answer is lost.
                    ObjectFault::AfterApply => {
                        let _ = request().await;
                        Err(injected(location))
                    }
                    ObjectFault::AfterApplyRetried => {
                        let _ = request().await;
                        request().await
                    }
                    ObjectFault::DroppedBeforeApply => Err(dropped(location)),
                    ObjectFault::DroppedAfterApply => {
                        let _ = request().await;
                        Err(dropped(location))
                    }
                }
            }
            _ => request().await,
        }
    }

    /// Waits for the test to let write `n` go when it is the held one.
    async fn hold_if_chosen(&self, n: usize) {
        let chosen = {
            let mut held = lock(&self.held);
            match held.take() {
                Some((at, reached, release)) if at == n => Some((reached, release)),
                other => {
                    *held = other;
                    None
                }
            }
        };
        if let Some((reached, release)) = chosen {
            let _ = reached.send(());
            // Let go, or the handle was dropped: either way the write goes on.
            let _ = release.await;
        }
    }

    fn strip_etag(&self, tag: Option<String>) -> Option<String> {
        if self.without_etags { None } else { tag }
    }
}

impl FaultyObjectStore {
    /// A store that passes every request to `inner` and counts the writes and reads.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        FaultyObjectStore { inner, faults: Arc::default() }
    }

    /// Fails write number `n` with `fault`; with `crash`, every request after it fails too.
    pub fn fail_write(inner: Arc<dyn ObjectStore>, n: usize, fault: ObjectFault, crash: bool) -> Self {
        let faults = Faults { fail_at: Some((n, fault)), crash, ..Faults::default() };
        FaultyObjectStore { inner, faults: Arc::new(faults) }
    }

    /// A store that holds write number `n` until the returned handle lets it go.
    pub fn hold_write(inner: Arc<dyn ObjectStore>, n: usize) -> (Self, HeldWrite) {
        let (reached_tx, reached_rx) = mpsc::channel();
        let (release_tx, release_rx) = oneshot::channel();
        let faults = Faults { held: Mutex::new(Some((n, reached_tx, release_rx))), ..Faults::default() };
        let held = HeldWrite { reached: Mutex::new(reached_rx), release: Mutex::new(Some(release_tx)) };
        (FaultyObjectStore { inner, faults: Arc::new(faults) }, held)
    }

    /// A store whose answers carry no ETag, so that nothing can be replaced
    /// conditionally on one.
    pub fn without_etags(inner: Arc<dyn ObjectStore>) -> Self {
        FaultyObjectStore { inner, faults: Arc::new(Faults { without_etags: true, ..Faults::default() }) }
    }

    /// The writes requested so far (the failed one included).
    pub fn writes(&self) -> usize {
        self.faults.writes.load(Ordering::SeqCst)
    }

    /// The reads (GET and HEAD) and listings requested so far.
    pub fn reads(&self) -> usize {
        self.faults.reads.load(Ordering::SeqCst)
    }

    /// True once the chosen write failed.
    pub fn fired(&self) -> bool {
        self.faults.fired.load(Ordering::SeqCst)
    }

    /// The key of the object the failed write was for, once it failed.
    pub fn fired_on(&self) -> Option<String> {
        lock(&self.faults.fired_on).clone()
    }
}

impl fmt::Display for FaultyObjectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyObjectStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyObjectStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let mut result =
            self.faults.write(location, || self.inner.put_opts(location, payload.clone(), opts.clone())).await?;
        result.e_tag = self.faults.strip_etag(result.e_tag);
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.faults.write(location, || self.inner.put_multipart_opts(location, opts.clone())).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.faults.alive_to_read(location)?;
        let mut result = self.inner.get_opts(location, options).await?;
        result.meta.e_tag = self.faults.strip_etag(result.meta.e_tag);
        Ok(result)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // One location at a time, each counted as a write.
        let (inner, faults) = (Arc::clone(&self.inner), Arc::clone(&self.faults));
        locations
            .then(move |location| {
                let (inner, faults) = (Arc::clone(&inner), Arc::clone(&faults));
                async move {
                    let path = location?;
                    faults.write(&path, || inner.delete(&path)).await.map(|()| path)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.faults.alive_to_read(prefix.unwrap_or(&Path::default())) {
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures::stream::once(async { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.faults.alive_to_read(prefix.unwrap_or(&Path::default()))?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.faults.write(to, || self.inner.copy_opts(from, to, options.clone())).await
    }
}
