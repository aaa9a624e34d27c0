//! Output that stays in this process: Arrow batches handed to a consumer, and a destination
//! that keeps the run's bookkeeping (run state, receipts, manifest) in memory.
//!
//! Why: a program that wants the rows, not files (the Python package's `read_arrow` and
//! `read_batches`), should get the engine's whole behaviour — one shared snapshot, chunked
//! parallel reads, retries, memory bounded by bytes, the same report — without a second code
//! path. So the engine runs unchanged with [`FormatOptions::Arrow`](crate::FormatOptions) over a
//! [`MemoryDestination`]: each part's batches go to a [`BatchConsumer`] as they are read
//! instead of being encoded, and the small bookkeeping objects land in a map.
//!
//! Back-pressure: [`BatchConsumer::deliver`] blocks the part's writer thread until the consumer
//! has room, which stops the worker's reader through the engine's one-batch channel, so memory
//! stays bounded by the planner's budget however slowly the consumer takes batches.
//!
//! Retries: a part that fails after delivering batches is reported with
//! [`BatchConsumer::aborted`]; the engine may then read it again from the start. A consumer that
//! still holds the part's batches drops them (the retry delivers the part whole); one that has
//! passed them on must fail instead, or rows would arrive twice.

use crate::destination::{CountingWriter, Destination, ObjectInfo, ObjectWriter};
use crate::format::{PartStats, PartWriter};
use crate::lock::{LockHolder, OutputLock};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use sluice_core::{Error, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex};

/// One part as the consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartKey {
    /// The dataset's name.
    pub dataset: String,
    /// The part's ordinal within the dataset (chunk order: key order for key ranges).
    pub ordinal: u32,
}

/// Takes the batches of an in-memory run (see the module documentation).
pub trait BatchConsumer: Send + Sync {
    /// A part starts, with its schema (every part of a dataset has the same one).
    fn open(&self, part: &PartKey, schema: &SchemaRef) -> Result<()>;
    /// One batch of `part`. Blocks until the consumer has room; an error (the consumer is
    /// gone or failed) aborts the part.
    fn deliver(&self, part: &PartKey, batch: RecordBatch) -> Result<()>;
    /// `part` was read whole: `rows` rows in every batch delivered for it.
    fn finished(&self, part: &PartKey, rows: u64);
    /// `part` failed after `delivered` batches; the engine may read it again from the start.
    fn aborted(&self, part: &PartKey, delivered: u64);
}

/// The consumer of a run's batches, as held by [`FormatOptions::Arrow`](crate::FormatOptions).
#[derive(Clone)]
pub struct ArrowOutput(pub Arc<dyn BatchConsumer>);

impl fmt::Debug for ArrowOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ArrowOutput")
    }
}

impl PartialEq for ArrowOutput {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ArrowOutput {}

/// A part whose batches go to a [`BatchConsumer`].
pub struct ArrowPart {
    consumer: Arc<dyn BatchConsumer>,
    key: PartKey,
    out: Option<CountingWriter>,
    rows: u64,
    bytes: u64,
    delivered: u64,
}

impl ArrowPart {
    /// Start part `key` for `consumer`; `out` is the (empty) object that records the part.
    pub fn new(
        consumer: Arc<dyn BatchConsumer>,
        key: PartKey,
        schema: &SchemaRef,
        out: CountingWriter,
    ) -> Result<Self> {
        consumer.open(&key, schema)?;
        Ok(ArrowPart {
            consumer,
            key,
            out: Some(out),
            rows: 0,
            bytes: 0,
            delivered: 0,
        })
    }
}

impl PartWriter for ArrowPart {
    fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        self.rows += batch.num_rows() as u64;
        self.bytes += batch.get_array_memory_size() as u64;
        // A clone shares the buffers: the reader cannot reuse them while the consumer holds
        // them (`sluice_core::columns` leaves shared buffers alone).
        self.consumer.deliver(&self.key, batch.clone())?;
        self.delivered += 1;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<PartStats> {
        let xxh3_128 = match self.out.take() {
            Some(out) => out.commit(self.rows)?.xxh3_128,
            None => String::new(),
        };
        self.consumer.finished(&self.key, self.rows);
        Ok(PartStats {
            rows: self.rows,
            // Arrow bytes handed over: what the consumer received, not a file's size.
            bytes: self.bytes,
            xxh3_128,
        })
    }

    fn abort(mut self: Box<Self>) {
        if let Some(out) = self.out.take() {
            out.abort();
        }
        self.consumer.aborted(&self.key, self.delivered);
    }
}

/// A destination in memory, for runs whose data goes to a [`BatchConsumer`]: it keeps the
/// run's bookkeeping objects (run state, receipts, manifest) in a map, so the engine's
/// commit protocol runs unchanged. Each instance is a fresh, empty output.
#[derive(Debug, Clone, Default)]
pub struct MemoryDestination {
    objects: Arc<Mutex<BTreeMap<String, Vec<u8>>>>,
}

impl MemoryDestination {
    /// A new, empty output.
    pub fn new() -> Self {
        Self::default()
    }

    fn store(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>>> {
        self.objects
            .lock()
            .map_err(|_| Error::internal("the in-memory output's map was poisoned"))
    }
}

/// An object being written in memory; visible once committed.
struct MemoryWriter {
    dest: MemoryDestination,
    path: String,
    data: Vec<u8>,
}

impl io::Write for MemoryWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.data.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ObjectWriter for MemoryWriter {
    fn commit(self: Box<Self>) -> Result<()> {
        let MemoryWriter { dest, path, data } = *self;
        dest.store()?.insert(path, data);
        Ok(())
    }

    fn abort(self: Box<Self>) {}
}

/// The lock of an in-memory output: nothing else can reach it.
struct NoLock;

#[async_trait]
impl OutputLock for NoLock {
    fn check(&self) -> Result<()> {
        Ok(())
    }

    async fn release(&self) {}
}

#[async_trait]
impl Destination for MemoryDestination {
    fn display(&self) -> String {
        "memory".to_string()
    }

    async fn check_writable(&self) -> Result<()> {
        Ok(())
    }

    fn create(&self, path: &str) -> Result<Box<dyn ObjectWriter>> {
        Ok(Box::new(MemoryWriter {
            dest: self.clone(),
            path: path.to_string(),
            data: Vec::new(),
        }))
    }

    async fn put(&self, path: &str, data: Vec<u8>) -> Result<()> {
        self.store()?.insert(path.to_string(), data);
        Ok(())
    }

    async fn get(&self, path: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.store()?.get(path).cloned())
    }

    async fn size(&self, path: &str) -> Result<Option<u64>> {
        Ok(self.store()?.get(path).map(|d| d.len() as u64))
    }

    fn read_range(&self, path: &str, start: u64, len: usize) -> Result<Vec<u8>> {
        let store = self.store()?;
        let data = store
            .get(path)
            .ok_or_else(|| Error::internal(format!("{path} is not in the in-memory output")))?;
        let start = (start as usize).min(data.len());
        let end = start.saturating_add(len).min(data.len());
        Ok(data[start..end].to_vec())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        Ok(self
            .store()?
            .iter()
            .filter(|(p, _)| p.starts_with(prefix))
            .map(|(p, d)| ObjectInfo {
                path: p.clone(),
                size: d.len() as u64,
            })
            .collect())
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.store()?.remove(path);
        Ok(())
    }

    async fn lock(&self, _holder: &LockHolder) -> Result<Arc<dyn OutputLock>> {
        Ok(Arc::new(NoLock))
    }
}
