//! The hand-off from a reader to a writer: a bounded channel of record batches plus shared
//! counters for progress.
//!
//! At most **two batches per worker** are alive: the one the writer is encoding and the one the
//! reader is filling. After handing a batch over, [`BatchSender::send`] waits until the writer
//! has taken it (so the previous one has been encoded and freed) before the reader starts the
//! next. Decoding and encoding still overlap, and memory per worker stays at about two batch
//! budgets plus the writer's row group, whatever the table size.

use arrow_array::RecordBatch;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Counters updated by readers as they go, read by the progress display and the report.
#[derive(Debug, Default)]
pub struct ReadCounters {
    /// Rows decoded so far.
    pub rows: AtomicU64,
    /// Bytes received from the source so far (wire bytes).
    pub bytes: AtomicU64,
}

impl ReadCounters {
    /// Add to both counters.
    pub fn add(&self, rows: u64, bytes: u64) {
        self.rows.fetch_add(rows, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// Where a [`crate::ChunkReader`] sends the batches of one chunk, and gets written batches
/// back to reuse their memory (see [`crate::columns`]).
#[derive(Debug)]
pub struct BatchSender {
    tx: mpsc::Sender<RecordBatch>,
    returned: Option<Mutex<std::sync::mpsc::Receiver<RecordBatch>>>,
    counters: Arc<ReadCounters>,
    batch_bytes: usize,
}

impl BatchSender {
    /// A sender over `tx`; readers cut batches at about `batch_bytes` of Arrow memory.
    pub fn new(
        tx: mpsc::Sender<RecordBatch>,
        counters: Arc<ReadCounters>,
        batch_bytes: usize,
    ) -> Self {
        BatchSender {
            tx,
            returned: None,
            counters,
            batch_bytes: batch_bytes.max(64 * 1024),
        }
    }

    /// Also receive the batches the writer has finished with, to recycle their memory.
    pub fn with_returns(mut self, returned: std::sync::mpsc::Receiver<RecordBatch>) -> Self {
        self.returned = Some(Mutex::new(returned));
        self
    }

    /// A batch the writer has finished with, if one is waiting.
    pub fn recycled(&self) -> Option<RecordBatch> {
        self.returned.as_ref()?.lock().ok()?.try_recv().ok()
    }

    /// The byte budget of one batch.
    pub fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// Record progress for rows decoded but not yet sent.
    pub fn progress(&self, rows: u64, wire_bytes: u64) {
        self.counters.add(rows, wire_bytes);
    }

    /// Hand a batch to the writer and wait until the writer has taken it, i.e. has finished
    /// encoding the previous one. Fails only when the writer has gone (it failed or the run is
    /// being cancelled); the writer's own error is the one to report.
    pub async fn send(&self, batch: RecordBatch) -> Result<(), WriterGone> {
        self.tx.send(batch).await.map_err(|_| WriterGone)?;
        // The slot frees when the writer takes this batch: only then may a third one start.
        let permit = self.tx.reserve().await.map_err(|_| WriterGone)?;
        drop(permit);
        Ok(())
    }
}

/// The writer side of a chunk stopped receiving (it failed or the run was cancelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterGone;
