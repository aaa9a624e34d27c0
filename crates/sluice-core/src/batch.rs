//! The hand-off from a reader to a writer: a bounded channel of record batches plus shared
//! counters for progress.
//!
//! At most **two batches per worker** are alive: the one the writer is encoding and the one the
//! reader is filling. After handing a batch over, [`BatchSender::send`] waits until the writer
//! has taken it (so the previous one has been encoded and freed) before the reader starts the
//! next. Decoding and encoding still overlap, and memory per worker stays at about two batch
//! budgets plus the writer's row group, whatever the table size.

use crate::error::{Error, Result};
use crate::source::ReadStats;
use crate::table::ColumnDesc;
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

impl BatchSender {
    /// Hand `cut` to the writer: count its progress, send it and wait until the writer has
    /// taken it. Returns a batch the writer has finished with, for the decoder to reuse. `what`
    /// names the chunk (`<dataset> part <n>`) in the error of a writer that stopped.
    pub async fn deliver(&self, cut: Cut, what: &str) -> Result<Option<RecordBatch>> {
        self.progress(cut.rows, cut.wire_bytes);
        self.send(cut.batch)
            .await
            .map_err(|WriterGone| Error::interrupted(format!("{what}: the writer stopped")))?;
        Ok(self.recycled())
    }
}

/// What a row decoder offers the read loop: rows and Arrow bytes buffered, batches built from
/// them, and the memory of written batches taken back.
pub trait Decoder: Send {
    /// Rows buffered since the last batch.
    fn rows(&self) -> usize;
    /// Arrow bytes buffered since the last batch.
    fn buffered_bytes(&self) -> usize;
    /// Build the batch of the buffered rows; the builders keep their memory for the next one.
    fn finish_batch(&mut self) -> Result<RecordBatch>;
    /// Take back the memory of a batch this decoder built, once the writer is done with it.
    fn recycle(&mut self, batch: RecordBatch);
}

/// A batch cut from a decoder, with the rows and wire bytes it accounts for.
#[derive(Debug)]
pub struct Cut {
    /// The batch.
    pub batch: RecordBatch,
    /// Its rows.
    pub rows: u64,
    /// Bytes received from the source since the previous cut.
    pub wire_bytes: u64,
}

/// The read loop's bookkeeping for one chunk, the same for every source: batches are cut when
/// the decoder holds the byte budget, rows and wire bytes are counted, and a chunk always sends
/// at least one batch (an empty part still carries its schema).
///
/// Synchronous on purpose: a reader on a thread of its own (Firebird's client library blocks)
/// uses it there and hands the cuts over its own channel; readers on the runtime use
/// [`ReadLoop`], which adds the sending.
#[derive(Debug)]
pub struct Batching {
    budget: usize,
    stats: ReadStats,
    unreported: u64,
    sent: bool,
}

impl Batching {
    /// Bookkeeping for batches of about `budget` Arrow bytes.
    pub fn new(budget: usize) -> Self {
        Batching {
            budget,
            stats: ReadStats::default(),
            unreported: 0,
            sent: false,
        }
    }

    /// Count `bytes` received from the source.
    pub fn received(&mut self, bytes: u64) {
        self.stats.wire_bytes += bytes;
        self.unreported += bytes;
    }

    /// The 1-based number, within the chunk, of the row the decoder is appending.
    pub fn row_number(&self, dec: &dyn Decoder) -> u64 {
        self.stats.rows + dec.rows() as u64 + 1
    }

    fn cut(&mut self, dec: &mut dyn Decoder) -> Result<Cut> {
        let batch = dec.finish_batch()?;
        let rows = batch.num_rows() as u64;
        self.stats.rows += rows;
        self.sent = true;
        Ok(Cut {
            batch,
            rows,
            wire_bytes: std::mem::take(&mut self.unreported),
        })
    }

    /// The batch to hand over now, if the decoder holds the byte budget.
    pub fn full(&mut self, dec: &mut dyn Decoder) -> Result<Option<Cut>> {
        if dec.buffered_bytes() >= self.budget {
            self.cut(dec).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The chunk's last batch, once every row was appended: the rows left, or an empty batch
    /// when nothing was sent yet.
    pub fn last(&mut self, dec: &mut dyn Decoder) -> Result<Option<Cut>> {
        if dec.rows() > 0 || !self.sent {
            self.cut(dec).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Rows and bytes so far.
    pub fn stats(&self) -> ReadStats {
        self.stats
    }
}

/// The read loop of a reader on the async runtime: [`Batching`] plus the hand-over to the
/// writer and the recycling of written batches.
pub struct ReadLoop<'a> {
    out: &'a BatchSender,
    what: &'a str,
    batching: Batching,
}

impl<'a> ReadLoop<'a> {
    /// The loop of the chunk `what` (`<dataset> part <n>`) sending into `out`.
    pub fn new(out: &'a BatchSender, what: &'a str) -> Self {
        ReadLoop {
            out,
            what,
            batching: Batching::new(out.batch_bytes()),
        }
    }

    /// Count `bytes` received from the source.
    pub fn received(&mut self, bytes: u64) {
        self.batching.received(bytes);
    }

    /// The 1-based number, within the chunk, of the row the decoder is appending.
    pub fn row_number(&self, dec: &dyn Decoder) -> u64 {
        self.batching.row_number(dec)
    }

    async fn deliver(&mut self, cut: Cut, dec: &mut dyn Decoder) -> Result<()> {
        if let Some(done) = self.out.deliver(cut, self.what).await? {
            // The writer has finished the batch before this one: reuse its memory.
            dec.recycle(done);
        }
        Ok(())
    }

    /// Hand a batch over if the decoder holds the byte budget (call after each row or each
    /// message received).
    pub async fn step(&mut self, dec: &mut dyn Decoder) -> Result<()> {
        match self.batching.full(dec) {
            Ok(Some(cut)) => self.deliver(cut, dec).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e.context(self.what)),
        }
    }

    /// Hand over the chunk's last batch (see [`Batching::last`]) and return the chunk's
    /// figures.
    pub async fn finish(mut self, dec: &mut dyn Decoder) -> Result<ReadStats> {
        match self.batching.last(dec) {
            Ok(Some(cut)) => self.deliver(cut, dec).await?,
            Ok(None) => {}
            Err(e) => return Err(e.context(self.what)),
        }
        Ok(self.batching.stats())
    }
}

/// The error of a value that could not be decoded: names the chunk, the column (with its
/// source type) and the row, so the user can find it.
pub fn value_error(what: &str, column: Option<&ColumnDesc>, row: u64, why: &str) -> Error {
    let col = column
        .map(|c| format!(" column {:?} ({})", c.name, c.source_type))
        .unwrap_or_default();
    Error::data(format!("{what}{col}, row {row}: {why}."))
}
