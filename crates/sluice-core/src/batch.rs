//! The hand-off from a reader to a writer: a bounded channel of record batches plus shared
//! counters for progress.
//!
//! Bounded by design: a reader that outpaces its writer waits, so memory stays at roughly
//! `(capacity + 2) × batch budget` per worker whatever the table size.

use arrow_array::RecordBatch;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// Where a [`crate::ChunkReader`] sends the batches of one chunk.
#[derive(Debug, Clone)]
pub struct BatchSender {
    tx: mpsc::Sender<RecordBatch>,
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
            counters,
            batch_bytes: batch_bytes.max(64 * 1024),
        }
    }

    /// The byte budget of one batch.
    pub fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// Record progress for rows decoded but not yet sent.
    pub fn progress(&self, rows: u64, wire_bytes: u64) {
        self.counters.add(rows, wire_bytes);
    }

    /// Send a batch, waiting while the writer is busy. Fails only when the writer has gone
    /// (it failed or the run is being cancelled); the writer's own error is the one to report.
    pub async fn send(&self, batch: RecordBatch) -> Result<(), WriterGone> {
        self.tx.send(batch).await.map_err(|_| WriterGone)
    }
}

/// The writer side of a chunk stopped receiving (it failed or the run was cancelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterGone;
