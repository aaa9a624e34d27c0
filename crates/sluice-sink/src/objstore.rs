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
//! Bookkeeping requests (`put`, `get`, `list`, `delete`, the lock) are awaited on the caller's
//! runtime. A writer runs on a blocking thread (the format encoder's) and starts each part's
//! upload as a task on the runtime it was created on, waiting for one only when
//! `upload_concurrency` parts are in flight; no private runtime, no thread per request.
//!
//! GCS: multipart uploads go through `object_store` (XML API); everything else goes through
//! the JSON API ([`crate::objstore_gcs`]). Uploads larger than one part use the XML
//! multipart API, which the GCS emulators do not serve, so that path is exercised only against
//! real GCS.

use crate::destination::{Destination, ObjectInfo, ObjectWriter};
use crate::lock::{LockHolder, OutputLock};
use crate::objstore_url::{self, Cloud, Location};
use async_trait::async_trait;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload};
use sluice_core::{Error, Result, Retry};
use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::Arc;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

/// The runtime a synchronous caller (a part writer, a range read for merging) is on. Such
/// callers run on the runtime's blocking threads, from where they wait for requests.
fn runtime() -> Result<Handle> {
    Handle::try_current().map_err(|_| {
        Error::internal("an object-store writer was used outside the runtime's blocking threads")
    })
}

/// What every writer of a destination shares: the parsed location itself.
pub(crate) type Shared = Location;

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
    pub(crate) shared: Arc<Shared>,
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
        Ok(ObjectStoreDestination {
            shared: Arc::new(objstore_url::open(to, options)?),
        })
    }

    /// Whether `to` names an object store this destination serves.
    pub fn handles(to: &str) -> bool {
        Cloud::of(to).is_some()
    }
}

#[async_trait]
impl Destination for ObjectStoreDestination {
    fn display(&self) -> String {
        self.shared.shown.clone()
    }

    async fn check_writable(&self) -> Result<()> {
        let probe = format!(".sluice-write-test-{:016x}", rand::random::<u64>());
        self.put(&probe, b"ok".to_vec())
            .await
            .map_err(|e| e.context("checking that --to is writable"))?;
        self.delete(&probe).await
    }

    fn buffer_bytes_per_writer(&self) -> u64 {
        // One part being filled plus up to `upload_concurrency` parts uploading.
        (1 + self.shared.upload_concurrency as u64) * self.shared.part_size as u64
    }

    fn create(&self, path: &str) -> Result<Box<dyn ObjectWriter>> {
        Ok(Box::new(UploadWriter {
            rt: runtime()?,
            shared: self.shared.clone(),
            path: path.to_string(),
            key: self.shared.key(path),
            buf: Vec::new(),
            upload: None,
            in_flight: VecDeque::new(),
            failed: false,
        }))
    }

    async fn put(&self, path: &str, data: Vec<u8>) -> Result<()> {
        let s = &self.shared;
        let key = s.key(path);
        if let Some(g) = &s.gcs {
            return g
                .put(&key, bytes::Bytes::from(data))
                .await
                .map_err(|e| s.error(&e, "write", path));
        }
        s.store
            .put(&key, PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(|e| s.error(&e, "write", path))
    }

    async fn get(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let s = &self.shared;
        let key = s.key(path);
        let got = if let Some(g) = &s.gcs {
            g.get(&key).await
        } else {
            match s.store.get(&key).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        };
        got.map(|b| b.map(|b| b.to_vec()))
            .map_err(|e| s.error(&e, "read", path))
    }

    async fn size(&self, path: &str) -> Result<Option<u64>> {
        let s = &self.shared;
        let key = s.key(path);
        if let Some(g) = &s.gcs {
            return g.size(&key).await.map_err(|e| s.error(&e, "inspect", path));
        }
        match s.store.head(&key).await {
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
        let key = s.key(path);
        let range = start..start + len as u64;
        let got = runtime()?.block_on(async {
            if let Some(g) = &s.gcs {
                return g.get_range(&key, range).await;
            }
            // A range past the end is clamped to the object, as a file read would be.
            let meta = s.store.head(&key).await?;
            let end = range.end.min(meta.size);
            if range.start >= end {
                return Ok(bytes::Bytes::new());
            }
            s.store.get_range(&key, range.start..end).await
        });
        got.map(|b| b.to_vec())
            .map_err(|e| s.error(&e, "read", path))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let s = &self.shared;
        let key = s.key(prefix);
        let listed: std::result::Result<Vec<(String, u64)>, object_store::Error> =
            if let Some(g) = &s.gcs {
                g.list(&key).await
            } else {
                let root = (!key.as_ref().is_empty()).then_some(key);
                let mut stream = s.store.list(root.as_ref());
                let mut out = Vec::new();
                let mut failed = None;
                while let Some(m) = stream.next().await {
                    match m {
                        Ok(m) => out.push((m.location.as_ref().to_string(), m.size)),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                match failed {
                    Some(e) => Err(e),
                    None => Ok(out),
                }
            };
        let listed = listed.map_err(|e| s.error(&e, "list", prefix))?;
        let mut out: Vec<ObjectInfo> = listed
            .into_iter()
            .filter_map(|(k, size)| s.relative(&k).map(|path| ObjectInfo { path, size }))
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    async fn lock(&self, holder: &LockHolder) -> Result<Arc<dyn OutputLock>> {
        crate::objstore_lock::acquire(self.shared.clone(), &self.display(), holder).await
    }

    fn versioned(&self) -> Option<&dyn crate::Versioned> {
        Some(self)
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let s = &self.shared;
        let key = s.key(path);
        if let Some(g) = &s.gcs {
            return g
                .delete(&key)
                .await
                .map_err(|e| s.error(&e, "delete", path));
        }
        match s.store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(s.error(&e, "delete", path)),
        }
    }
}

/// A file being uploaded.
struct UploadWriter {
    /// The runtime the parts upload on.
    rt: Handle,
    shared: Arc<Shared>,
    path: String,
    key: Path,
    /// The part being filled.
    buf: Vec<u8>,
    /// Started when the first part is full; a smaller file is stored with one `PUT`.
    upload: Option<Box<dyn MultipartUpload>>,
    /// Parts being sent, oldest first.
    in_flight: VecDeque<JoinHandle<object_store::Result<()>>>,
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
            self.rt
                .block_on(p)
                .map_err(|e| Error::internal(format!("an upload task failed: {e}")))?
                .map_err(|e| self.shared.error(&e, "upload a part of", &self.path))?;
        }
        Ok(())
    }

    /// Send the buffered part, starting the multipart upload if needed.
    fn send_part(&mut self) -> Result<()> {
        if self.upload.is_none() {
            let up = self
                .rt
                .block_on(self.shared.store.put_multipart(&self.key))
                .map_err(|e| self.shared.error(&e, "start uploading", &self.path))?;
            self.upload = Some(up);
        }
        let data = std::mem::take(&mut self.buf);
        if let Some(up) = self.upload.as_mut() {
            let part = up.put_part(PutPayload::from(data));
            self.in_flight.push_back(self.rt.spawn(part));
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
        if let Some(mut up) = self.upload.take() {
            self.rt.spawn(async move {
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
            let (s, key) = (&self.shared, &self.key);
            let data = std::mem::take(&mut self.buf);
            let put = self.rt.block_on(async {
                match &s.gcs {
                    Some(g) => g.put(key, bytes::Bytes::from(data)).await,
                    None => s.store.put(key, PutPayload::from(data)).await.map(|_| ()),
                }
            });
            return put.map_err(|e| s.error(&e, "write", &self.path));
        };
        if !self.buf.is_empty() {
            let part = up.put_part(PutPayload::from(std::mem::take(&mut self.buf)));
            self.in_flight.push_back(self.rt.spawn(part));
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
        match self.rt.block_on(async move {
            let r = up.complete().await;
            if r.is_err() {
                let _ = up.abort().await;
            }
            r
        }) {
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
