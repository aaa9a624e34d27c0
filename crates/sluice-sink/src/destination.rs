//! Where output goes, and how a file becomes visible atomically.

use crate::lock::{LockHolder, OutputLock};
use async_trait::async_trait;
use sluice_core::{Error, Result, Retry};
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

/// One stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the destination root, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// An output location. Paths are relative to its root and use `/`.
///
/// Contract: an object written with [`Destination::create`] is invisible under its final name
/// until [`ObjectWriter::commit`] returns; [`Destination::put`] is atomic. A crash leaves at most
/// hidden temporary objects (names starting with `.`), which readers such as Spark, DuckDB
/// and pyarrow skip, and which a resumed run removes.
///
/// One model for every store: the engine's bookkeeping calls (`put`, `get`, `list`, `delete`,
/// the lock) are `async` and run on the caller's runtime, so an object store awaits its client
/// directly and local disk moves its file calls to the runtime's blocking threads. Part
/// writers and range reads ([`Destination::create`], [`Destination::read_range`]) are
/// synchronous because the format encoders that use them run on blocking threads (encoding is
/// CPU work); an object store's writer reaches the runtime from there through the handle of
/// the runtime it was created on. No store has a runtime of its own.
#[async_trait]
pub trait Destination: Send + Sync {
    /// The location for messages and the manifest (secrets redacted).
    fn display(&self) -> String;

    /// Fail early, with the fix in the message, if the location cannot be written.
    async fn check_writable(&self) -> Result<()>;

    /// Start writing the object at `path`. Call it on a blocking thread of the runtime (the
    /// writer is used there).
    fn create(&self, path: &str) -> Result<Box<dyn ObjectWriter>>;

    /// Memory one open writer holds at most besides what the format buffers (upload parts in
    /// flight for object stores; nothing for local files, which the kernel buffers). The
    /// planner takes it out of the memory target before sizing batches.
    fn buffer_bytes_per_writer(&self) -> u64 {
        0
    }

    /// Write a whole small object atomically (manifest, receipts).
    async fn put(&self, path: &str, data: Vec<u8>) -> Result<()>;

    /// Read a whole object, or `None` if it does not exist.
    async fn get(&self, path: &str) -> Result<Option<Vec<u8>>>;

    /// Size of an object, or `None` if it does not exist.
    async fn size(&self, path: &str) -> Result<Option<u64>>;

    /// Read `len` bytes at `start` of an object (fewer only at its end). Synchronous, for
    /// blocking threads (merging parts).
    fn read_range(&self, path: &str, start: u64, len: usize) -> Result<Vec<u8>>;

    /// Every object under `prefix` (recursively), hidden temporaries included.
    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>>;

    /// Delete an object; deleting a missing object is not an error.
    async fn delete(&self, path: &str) -> Result<()>;

    /// Take the output's lock for `holder`, or fail with a configuration error naming the run
    /// that holds it (see [`crate::lock`]). A lock left by a run that died is taken over.
    async fn lock(&self, holder: &LockHolder) -> Result<Arc<dyn OutputLock>>;

    /// Conditional writes, where the store has them (object stores): what lets a small object
    /// (the stream's state) be written only by the run that last wrote it.
    fn versioned(&self) -> Option<&dyn Versioned> {
        None
    }

    /// True when the output's lock lives exactly as long as its holder's process (a local
    /// file lock the kernel releases when the process ends): no other run can take the output
    /// over from a holder that is only paused, so nothing else needs fencing.
    fn lock_lives_with_process(&self) -> bool {
        false
    }
}

/// The version of a stored object that a conditional write names (opaque).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion(pub(crate) crate::objstore_versions::Version);

/// Conditional reads and writes of small objects (see [`Destination::versioned`]).
#[async_trait]
pub trait Versioned: Send + Sync {
    /// The object at `path` with its version, or `None` when it does not exist.
    async fn get_versioned(&self, path: &str) -> Result<Option<(Vec<u8>, ObjectVersion)>>;

    /// Write `data` at `path` only while the object is still at `expected` (`None`: only while
    /// it does not exist). The new version, or `None` when another writer changed it.
    async fn put_if(
        &self,
        path: &str,
        data: Vec<u8>,
        expected: Option<&ObjectVersion>,
    ) -> Result<Option<ObjectVersion>>;
}

/// Run blocking work (file system calls) on the runtime's blocking threads.
pub async fn on_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::internal(format!("a blocking task failed: {e}")))?
}

/// An object being written. Dropping it without [`ObjectWriter::commit`] aborts it.
pub trait ObjectWriter: Write + Send {
    /// Make the object visible under its final name, durably.
    fn commit(self: Box<Self>) -> Result<()>;
    /// Discard what was written.
    fn abort(self: Box<Self>);
}

/// Turn an I/O error on `path` into a destination error with the fix.
pub fn io_error(e: &io::Error, action: &str, path: &str) -> Error {
    let (retry, fix) = match (e.kind(), e.raw_os_error()) {
        (_, Some(28)) | (io::ErrorKind::StorageFull, _) => (
            Retry::Permanent,
            "The disk is full: free space or write to another location with --to.",
        ),
        (io::ErrorKind::PermissionDenied, _) | (_, Some(30)) => (
            Retry::Permanent,
            "The location is not writable by this user: fix its permissions or choose another \
             --to.",
        ),
        (io::ErrorKind::NotFound, _) => {
            (Retry::Permanent, "A directory on the path does not exist.")
        }
        (io::ErrorKind::Interrupted | io::ErrorKind::TimedOut, _) => (Retry::Transient, ""),
        _ => (Retry::Permanent, ""),
    };
    let mut msg = format!("could not {action} {path}: {e}.");
    if !fix.is_empty() {
        msg.push(' ');
        msg.push_str(fix);
    }
    Error::destination(retry, msg)
}

/// The first I/O error an [`ObjectWriter`] hit, kept so that an error surfacing through a
/// format library (which flattens it to text) can still be reported as what it was.
#[derive(Debug, Clone, Default)]
pub struct FirstIoError(Arc<Mutex<Option<Error>>>);

impl FirstIoError {
    /// Remember `e` if nothing was remembered yet.
    pub fn record(&self, e: Error) {
        if let Ok(mut slot) = self.0.lock() {
            slot.get_or_insert(e);
        }
    }

    /// The remembered error, if any.
    pub fn take(&self) -> Option<Error> {
        self.0.lock().ok().and_then(|mut s| s.take())
    }
}

/// Counts and hashes the bytes written through it (xxh3-128 of the whole object), and keeps
/// the first I/O error.
pub struct CountingWriter {
    inner: Box<dyn ObjectWriter>,
    hasher: xxhash_rust::xxh3::Xxh3,
    bytes: u64,
    first_error: FirstIoError,
    path: String,
}

impl CountingWriter {
    /// Wrap `inner`, which writes `path`.
    pub fn new(inner: Box<dyn ObjectWriter>, path: &str) -> Self {
        CountingWriter {
            inner,
            hasher: xxhash_rust::xxh3::Xxh3::new(),
            bytes: 0,
            first_error: FirstIoError::default(),
            path: path.to_string(),
        }
    }

    /// Where the first I/O error is kept.
    pub fn errors(&self) -> FirstIoError {
        self.first_error.clone()
    }

    /// Commit the object holding `rows` rows; returns what the part holds (its bytes and
    /// their xxh3-128, counted as they were written).
    pub fn commit(mut self, rows: u64) -> Result<crate::format::PartStats> {
        self.inner
            .flush()
            .map_err(|e| io_error(&e, "write", &self.path))?;
        let xxh3_128 = format!("{:032x}", self.hasher.digest128());
        self.inner.commit()?;
        Ok(crate::format::PartStats {
            rows,
            bytes: self.bytes,
            xxh3_128,
        })
    }

    /// Abort the object.
    pub fn abort(self) {
        self.inner.abort();
    }
}

impl Write for CountingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.inner.write(buf) {
            Ok(n) => {
                self.hasher.update(&buf[..n]);
                self.bytes += n as u64;
                Ok(n)
            }
            Err(e) => {
                self.first_error.record(io_error(&e, "write", &self.path));
                Err(e)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner
            .flush()
            .inspect_err(|e| self.first_error.record(io_error(e, "write", &self.path)))
    }
}

/// Reads an object sequentially in blocks through [`Destination::read_range`], so copying a
/// large object holds one block in memory, whatever the destination.
pub struct RangeReader {
    dest: std::sync::Arc<dyn Destination>,
    path: String,
    pos: u64,
    end: u64,
    block: Vec<u8>,
    at: usize,
    /// The next read's size: small at first, doubling up to [`READ_BLOCK`].
    next: usize,
}

/// Largest block a [`RangeReader`] reads at once.
const READ_BLOCK: usize = 4 << 20;

/// A [`RangeReader`]'s first block. The Parquet reader opens one per page only to parse the
/// page's header (a few hundred bytes) and fetches the page itself by range: a first read of
/// a whole [`READ_BLOCK`] made reading a part back move 4 MB per page (a rewrite of a
/// converged export spent a quarter of its time there); long sequential reads (merging CSV)
/// reach the full block after a few reads.
const FIRST_BLOCK: usize = 16 << 10;

impl RangeReader {
    /// Read `path` from `start` to `end` (exclusive).
    pub fn new(dest: std::sync::Arc<dyn Destination>, path: &str, start: u64, end: u64) -> Self {
        RangeReader {
            dest,
            path: path.to_string(),
            pos: start,
            end,
            block: Vec::new(),
            at: 0,
            next: FIRST_BLOCK,
        }
    }
}

impl io::Read for RangeReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.block.len() {
            if self.pos >= self.end {
                return Ok(0);
            }
            let want = (self.end - self.pos).min(self.next as u64) as usize;
            self.next = (self.next * 2).min(READ_BLOCK);
            self.block = self
                .dest
                .read_range(&self.path, self.pos, want)
                .map_err(io::Error::other)?;
            if self.block.is_empty() {
                return Ok(0);
            }
            self.pos += self.block.len() as u64;
            self.at = 0;
        }
        let n = buf.len().min(self.block.len() - self.at);
        buf[..n].copy_from_slice(&self.block[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}
