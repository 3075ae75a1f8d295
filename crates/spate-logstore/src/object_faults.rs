//! Fault injection for checkpoints in an object store: [`FaultyObjectStore`]
//! wraps any `object_store` store and makes one chosen write request fail,
//! either before the store applies it or after (the write landed but its
//! answer was lost, as when a connection drops), and then, if asked, fails
//! every later request as if the process had died there.
//!
//! Counting only writes (put, delete, copy) makes "crash at every step" a
//! loop over one number, as [`crate::FaultyFileManager`] does for files.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, ObjectStoreExt,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// When the chosen write fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFault {
    /// The request is refused before the store applies it.
    BeforeApply,
    /// The store applies it, then the caller gets an error.
    AfterApply,
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
    writes: AtomicUsize,
    fired: AtomicBool,
}

fn injected(location: &Path) -> object_store::Error {
    let source = format!("injected fault writing {location}").into();
    object_store::Error::Generic { store: "FaultyObjectStore", source }
}

impl Faults {
    /// Refused once the process has "died".
    fn alive(&self, location: &Path) -> object_store::Result<()> {
        if self.crash && self.fired.load(Ordering::SeqCst) { Err(injected(location)) } else { Ok(()) }
    }

    /// Runs one write, failing it when it is the chosen one.
    async fn write<T>(
        &self,
        location: &Path,
        apply: impl Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        self.alive(location)?;
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        match self.fail_at {
            Some((at, fault)) if at == n => {
                self.fired.store(true, Ordering::SeqCst);
                if fault == ObjectFault::AfterApply {
                    // Applied; only the answer is lost.
                    let _ = apply.await;
                }
                Err(injected(location))
            }
            _ => apply.await,
        }
    }
}

impl FaultyObjectStore {
    /// A store that passes every request to `inner` and counts the writes.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        FaultyObjectStore { inner, faults: Arc::default() }
    }

    /// Fails write number `n` with `fault`; with `crash`, every request after it fails too.
    pub fn fail_write(inner: Arc<dyn ObjectStore>, n: usize, fault: ObjectFault, crash: bool) -> Self {
        let faults = Faults { fail_at: Some((n, fault)), crash, ..Faults::default() };
        FaultyObjectStore { inner, faults: Arc::new(faults) }
    }

    /// The writes requested so far (the failed one included).
    pub fn writes(&self) -> usize {
        self.faults.writes.load(Ordering::SeqCst)
    }

    /// True once the chosen write failed.
    pub fn fired(&self) -> bool {
        self.faults.fired.load(Ordering::SeqCst)
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
        self.faults.write(location, self.inner.put_opts(location, payload, opts)).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.faults.write(location, self.inner.put_multipart_opts(location, opts)).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        self.faults.alive(location)?;
        self.inner.get_opts(location, options).await
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
                    faults.write(&path, inner.delete(&path)).await.map(|()| path)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.faults.alive(prefix.unwrap_or(&Path::default())) {
            Ok(()) => self.inner.list(prefix),
            Err(e) => futures::stream::once(async { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.faults.alive(prefix.unwrap_or(&Path::default()))?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.faults.write(to, self.inner.copy_opts(from, to, options)).await
    }
}
