//! Object-store destination: S3 (and S3-compatible stores), Google Cloud Storage, Azure Blob.
//!
//! Files stream out as multipart uploads: a writer buffers one part (`part_size`, 5MB by
//! default) and hands full parts to the upload, at most `upload_concurrency` in flight, so
//! memory per open file is about `(1 + upload_concurrency) × part_size` whatever the file's
//! size. An object becomes visible only when its upload is completed, which is atomic on
//! every store; a file smaller than one part is stored with one atomic `PUT`. A writer dropped
//! or aborted before its commit aborts the upload. A process killed mid-upload leaves an
//! incomplete multipart upload, which is invisible to readers and listings but is billed
//! until removed: configure the bucket's lifecycle rule to abort incomplete uploads.
//!
//! The [`Destination`] trait is synchronous (writers run on blocking threads); requests run on
//! one small runtime owned by this module, and callers wait on a channel, so a call works from
//! any thread.
//!
//! GCS: multipart uploads go through `object_store` (XML API); everything else goes through
//! the JSON API ([`crate::objstore_gcs`]). Uploads larger than one part use the XML
//! multipart API, which the GCS emulators do not serve, so that path is exercised only against
//! real GCS.

use crate::destination::{Destination, ObjectInfo, ObjectWriter};
use crate::lock::{LockHolder, OutputLock};
use crate::objstore_gcs::GcsJson;
use crate::objstore_url::{self, Cloud, Location};
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload};
use sluice_core::{Error, Result, Retry};
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, Write};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

/// The runtime that runs every object-store request of the process. It lives as long as the
/// process, so dropping a destination anywhere (even inside another runtime) is safe.
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-upload")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| Error::internal(format!("cannot start the upload runtime: {e}")))
}

/// A started request whose result is waited for later.
struct Pending<T>(mpsc::Receiver<T>);

impl<T> Pending<T> {
    fn wait(self) -> Result<T> {
        self.0
            .recv()
            .map_err(|_| Error::internal("an upload task ended without a result"))
    }
}

/// Start `fut` on the upload runtime.
fn start<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> Result<Pending<T>> {
    let (tx, rx) = mpsc::sync_channel(1);
    runtime()?.spawn(async move {
        let _ = tx.send(fut.await);
    });
    Ok(Pending(rx))
}

/// Run `fut` on the upload runtime and wait for it.
pub(crate) fn run<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> Result<T> {
    start(fut)?.wait()
}

/// What every writer of a destination shares.
pub(crate) struct Shared {
    cloud: Cloud,
    pub(crate) store: Arc<dyn ObjectStore>,
    bucket: String,
    prefix: String,
    shown: String,
    part_size: usize,
    upload_concurrency: usize,
    pub(crate) gcs: Option<GcsJson>,
}

impl Shared {
    pub(crate) fn key(&self, path: &str) -> Path {
        let path = path.trim_matches('/');
        match (self.prefix.is_empty(), path.is_empty()) {
            (true, _) => Path::from(path),
            (false, true) => Path::from(self.prefix.as_str()),
            (false, false) => Path::from(format!("{}/{path}", self.prefix)),
        }
    }

    fn shown(&self, path: &str) -> String {
        format!("{}/{}", self.shown.trim_end_matches('/'), path)
    }

    pub(crate) fn error(&self, e: &object_store::Error, action: &str, path: &str) -> Error {
        objstore_url::classify(
            e,
            self.cloud,
            &self.bucket,
            &format!("{action} {}", self.shown(path)),
        )
    }

    /// `key` relative to the root, decoded, or `None` if it is outside it.
    fn relative(&self, key: &str) -> Option<String> {
        let rel = if self.prefix.is_empty() {
            key
        } else {
            let p = Path::from(self.prefix.as_str());
            key.strip_prefix(p.as_ref())?.strip_prefix('/')?
        };
        Some(
            percent_encoding::percent_decode_str(rel)
                .decode_utf8_lossy()
                .into_owned(),
        )
    }
}

/// An S3, GCS or Azure location (`s3://bucket/prefix`, `gs://…`, `az://container/prefix`).
pub struct ObjectStoreDestination {
    shared: Arc<Shared>,
}

impl ObjectStoreDestination {
    /// Open the location `to`; see [`crate::objstore_url`] for the URL forms and options.
    /// Builds the client only; [`Destination::check_writable`] makes the first request.
    pub fn open(to: &str) -> Result<Self> {
        Self::open_with(to, &[])
    }

    /// [`Self::open`] with options given outside the URL (same keys as its query, e.g.
    /// `part_size`, `upload_concurrency`, `endpoint`, `region`), which win over the query.
    pub fn open_with(to: &str, options: &[(String, String)]) -> Result<Self> {
        runtime()?;
        let Location {
            cloud,
            store,
            bucket,
            prefix,
            shown,
            part_size,
            upload_concurrency,
            gcs,
        } = objstore_url::open(to, options)?;
        Ok(ObjectStoreDestination {
            shared: Arc::new(Shared {
                cloud,
                store,
                bucket,
                prefix,
                shown,
                part_size,
                upload_concurrency,
                gcs,
            }),
        })
    }

    /// Whether `to` names an object store this destination serves.
    pub fn handles(to: &str) -> bool {
        Cloud::of(to).is_some()
    }
}

impl Destination for ObjectStoreDestination {
    fn display(&self) -> String {
        self.shared.shown.clone()
    }

    fn check_writable(&self) -> Result<()> {
        let probe = format!(".sluice-write-test-{:016x}", rand::random::<u64>());
        self.put(&probe, b"ok")
            .map_err(|e| e.context("checking that --to is writable"))?;
        self.delete(&probe)
    }

    fn buffer_bytes_per_writer(&self) -> u64 {
        // One part being filled plus up to `upload_concurrency` parts uploading.
        (1 + self.shared.upload_concurrency as u64) * self.shared.part_size as u64
    }

    fn create(&self, path: &str) -> Result<Box<dyn ObjectWriter>> {
        Ok(Box::new(UploadWriter {
            shared: self.shared.clone(),
            path: path.to_string(),
            key: self.shared.key(path),
            buf: Vec::new(),
            upload: None,
            in_flight: VecDeque::new(),
            failed: false,
        }))
    }

    fn put(&self, path: &str, data: &[u8]) -> Result<()> {
        let s = self.shared.clone();
        let key = s.key(path);
        if let Some(g) = s.gcs.clone() {
            let data = bytes::Bytes::from(data.to_vec());
            return run(async move { g.put(&key, data).await })?
                .map_err(|e| s.error(&e, "write", path));
        }
        let payload = PutPayload::from(data.to_vec());
        let store = s.store.clone();
        run(async move { store.put(&key, payload).await })?
            .map(|_| ())
            .map_err(|e| s.error(&e, "write", path))
    }

    fn get(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let s = self.shared.clone();
        let (store, key) = (s.store.clone(), s.key(path));
        if let Some(g) = s.gcs.clone() {
            return run(async move { g.get(&key).await })?
                .map(|b| b.map(|b| b.to_vec()))
                .map_err(|e| s.error(&e, "read", path));
        }
        let got = run(async move {
            match store.get(&key).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        })?;
        got.map(|b| b.map(|b| b.to_vec()))
            .map_err(|e| s.error(&e, "read", path))
    }

    fn size(&self, path: &str) -> Result<Option<u64>> {
        let s = self.shared.clone();
        let (store, key) = (s.store.clone(), s.key(path));
        if let Some(g) = s.gcs.clone() {
            return run(async move { g.size(&key).await })?
                .map_err(|e| s.error(&e, "inspect", path));
        }
        match run(async move { store.head(&key).await })? {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(s.error(&e, "inspect", path)),
        }
    }

    fn read_range(&self, path: &str, start: u64, len: usize) -> Result<Vec<u8>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let s = self.shared.clone();
        let (store, key) = (s.store.clone(), s.key(path));
        let range = start..start + len as u64;
        if let Some(g) = s.gcs.clone() {
            return run(async move { g.get_range(&key, range).await })?
                .map(|b| b.to_vec())
                .map_err(|e| s.error(&e, "read", path));
        }
        let got = run(async move {
            // A range past the end is clamped to the object, as a file read would be.
            let meta = store.head(&key).await?;
            let end = range.end.min(meta.size);
            if range.start >= end {
                return Ok(bytes::Bytes::new());
            }
            store.get_range(&key, range.start..end).await
        })?;
        got.map(|b| b.to_vec())
            .map_err(|e| s.error(&e, "read", path))
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let s = self.shared.clone();
        let key = s.key(prefix);
        let listed: std::result::Result<Vec<(String, u64)>, object_store::Error> =
            if let Some(g) = s.gcs.clone() {
                run(async move { g.list(&key).await })?
            } else {
                let store = s.store.clone();
                run(async move {
                    let root = (!key.as_ref().is_empty()).then_some(key);
                    let mut stream = store.list(root.as_ref());
                    let mut out = Vec::new();
                    while let Some(m) = stream.next().await {
                        let m = m?;
                        out.push((m.location.as_ref().to_string(), m.size));
                    }
                    Ok(out)
                })?
            };
        let listed = listed.map_err(|e| s.error(&e, "list", prefix))?;
        let mut out: Vec<ObjectInfo> = listed
            .into_iter()
            .filter_map(|(k, size)| s.relative(&k).map(|path| ObjectInfo { path, size }))
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn lock(&self, holder: &LockHolder) -> Result<Arc<dyn OutputLock>> {
        crate::objstore_lock::acquire(self.shared.clone(), &self.display(), holder)
    }

    fn delete(&self, path: &str) -> Result<()> {
        let s = self.shared.clone();
        let (store, key) = (s.store.clone(), s.key(path));
        if let Some(g) = s.gcs.clone() {
            return run(async move { g.delete(&key).await })?
                .map_err(|e| s.error(&e, "delete", path));
        }
        match run(async move { store.delete(&key).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(s.error(&e, "delete", path)),
        }
    }
}

/// A file being uploaded.
struct UploadWriter {
    shared: Arc<Shared>,
    path: String,
    key: Path,
    /// The part being filled.
    buf: Vec<u8>,
    /// Started when the first part is full; a smaller file is stored with one `PUT`.
    upload: Option<Box<dyn MultipartUpload>>,
    /// Parts being sent, oldest first.
    in_flight: VecDeque<Pending<object_store::Result<()>>>,
    /// A part failed: the upload is aborted and every further write fails.
    failed: bool,
}

impl UploadWriter {
    fn io_err(e: Error) -> io::Error {
        io::Error::other(e.to_string())
    }

    /// Wait for the oldest part in flight.
    fn wait_oldest(&mut self) -> Result<()> {
        if let Some(p) = self.in_flight.pop_front() {
            p.wait()?
                .map_err(|e| self.shared.error(&e, "upload a part of", &self.path))?;
        }
        Ok(())
    }

    /// Send the buffered part, starting the multipart upload if needed.
    fn send_part(&mut self) -> Result<()> {
        if self.upload.is_none() {
            let (store, key) = (self.shared.store.clone(), self.key.clone());
            let up = run(async move { store.put_multipart(&key).await })?
                .map_err(|e| self.shared.error(&e, "start uploading", &self.path))?;
            self.upload = Some(up);
        }
        let data = std::mem::take(&mut self.buf);
        if let Some(up) = self.upload.as_mut() {
            let part = up.put_part(PutPayload::from(data));
            self.in_flight.push_back(start(part)?);
        }
        while self.in_flight.len() > self.shared.upload_concurrency {
            self.wait_oldest()?;
        }
        Ok(())
    }

    fn fail<T>(&mut self, e: Error) -> Result<T> {
        self.failed = true;
        self.discard();
        Err(e)
    }

    /// Abort the multipart upload, if one was started (in the background: nothing waits).
    fn discard(&mut self) {
        self.buf = Vec::new();
        self.in_flight.clear();
        if let Some(mut up) = self.upload.take()
            && let Ok(rt) = runtime()
        {
            rt.spawn(async move {
                let _ = up.abort().await;
            });
        }
    }

    fn finish(&mut self) -> Result<()> {
        if self.failed {
            return Err(Error::destination(
                Retry::Transient,
                format!("upload of {} failed earlier", self.shared.shown(&self.path)),
            ));
        }
        let Some(mut up) = self.upload.take() else {
            // Smaller than one part: one atomic PUT.
            let (store, key) = (self.shared.store.clone(), self.key.clone());
            if let Some(g) = self.shared.gcs.clone() {
                let data = bytes::Bytes::from(std::mem::take(&mut self.buf));
                return run(async move { g.put(&key, data).await })?
                    .map_err(|e| self.shared.error(&e, "write", &self.path));
            }
            let payload = PutPayload::from(std::mem::take(&mut self.buf));
            return run(async move { store.put(&key, payload).await })?
                .map(|_| ())
                .map_err(|e| self.shared.error(&e, "write", &self.path));
        };
        if !self.buf.is_empty() {
            let part = up.put_part(PutPayload::from(std::mem::take(&mut self.buf)));
            self.in_flight.push_back(start(part)?);
        }
        self.upload = Some(up);
        while !self.in_flight.is_empty() {
            if let Err(e) = self.wait_oldest() {
                return self.fail(e);
            }
        }
        let Some(mut up) = self.upload.take() else {
            return Err(Error::internal("upload vanished"));
        };
        match run(async move {
            let r = up.complete().await;
            if r.is_err() {
                let _ = up.abort().await;
            }
            r
        })? {
            Ok(_) => Ok(()),
            Err(e) => {
                self.failed = true;
                Err(self.shared.error(&e, "complete the upload of", &self.path))
            }
        }
    }
}

impl Write for UploadWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::other("the upload failed earlier"));
        }
        let part = self.shared.part_size;
        if self.buf.capacity() == 0 {
            // One allocation per part: growing by doubling would overshoot the part size.
            self.buf.reserve_exact(part);
        }
        let n = data.len().min(part - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == part
            && let Err(e) = self.send_part()
        {
            return self.fail(e).map_err(Self::io_err);
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Parts are sent when full; flushing early would make undersized parts.
        Ok(())
    }
}

impl ObjectWriter for UploadWriter {
    fn commit(mut self: Box<Self>) -> Result<()> {
        self.finish()
    }

    fn abort(mut self: Box<Self>) {
        self.discard();
    }
}

impl Drop for UploadWriter {
    fn drop(&mut self) {
        self.discard();
    }
}
