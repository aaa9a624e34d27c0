//! A worker: takes chunks from the queue one at a time and turns each into a committed part.
//!
//! Per chunk, the worker's session streams batches into a bounded channel and a blocking
//! thread encodes them into the part file, so decoding and encoding overlap. The part is
//! committed only if the read finished cleanly; otherwise the writer aborts it and nothing
//! appears under the final name. After a transient failure the chunk is read again from the
//! start — bounded by the retry policy. A *source* failure discards the session (it may sit in
//! an aborted transaction) and a new one joins the same snapshot; any other failure (the
//! destination's, such as an object store's 5xx) keeps it: the session did nothing wrong, and
//! where a snapshot cannot be rejoined (MySQL) a replacement would use up one of its few spare
//! sessions. A kept session that turns out broken fails its next read with a source error and
//! is discarded then. (An interrupted read may leave the rest of its result unread; the
//! drivers drain it before the next statement.)

use crate::governor::Gate;
use crate::manifest::PartRecord;
use crate::queue::WorkQueue;
use crate::retry::RetryPolicy;
use arrow_array::RecordBatch;
use sluice_core::{
    BatchSender, Chunk, ChunkReader, Coordinator, Dataset, Error, ErrorKind, ReadCounters, Result,
    failpoint,
};
use sluice_sink::{Destination, FormatOptions, PartKey, PartStats, layout, open_part};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::sync::{Mutex, mpsc, oneshot, watch};

/// Everything workers share.
pub struct WorkerContext {
    /// The chunks left.
    pub queue: WorkQueue,
    /// Datasets by name.
    pub datasets: HashMap<String, Dataset>,
    /// The coordinator, for replacing lost sessions.
    pub coordinator: Arc<Mutex<Box<dyn Coordinator>>>,
    /// Output location.
    pub destination: Arc<dyn Destination>,
    /// Output format.
    pub format: FormatOptions,
    /// Whether parts will be merged into one file per dataset.
    pub merge: bool,
    /// Batch byte budget.
    pub batch_bytes: usize,
    /// Retry bounds.
    pub retry: RetryPolicy,
    /// Index of the snapshot this run reads under.
    pub snapshot_index: u32,
    /// Rows and bytes read.
    pub counters: Arc<ReadCounters>,
    /// Parts committed in this run.
    pub parts_done: Arc<AtomicU64>,
    /// The harm budget's gate, asked before each chunk.
    pub gate: Gate,
    /// Retries taken.
    pub retries: AtomicU64,
    /// Receipts of this run's parts.
    pub committed: std::sync::Mutex<Vec<PartRecord>>,
    /// Part writers still running (an aborted part's writer ends on its own thread).
    pub writers: Writers,
    /// The longest a chunk's read took, in milliseconds: with chunk consistency, the longest
    /// a chunk's transaction lived.
    pub longest_read_ms: AtomicU64,
    /// A table format's part names carry the export's run id (see
    /// [`layout::table_part_path`]); `None` for file formats.
    pub part_tag: Option<String>,
}

/// Counts the part writers still running, so a run can wait for every one of them — an
/// aborted part's writer removes its temporary file when it ends, after its worker is gone.
#[derive(Debug)]
pub struct Writers(Arc<watch::Sender<usize>>);

impl Default for Writers {
    fn default() -> Self {
        Writers(Arc::new(watch::Sender::new(0)))
    }
}

/// One running writer; dropping it (however the writer ends) counts it out.
pub struct WriterGuard(Arc<watch::Sender<usize>>);

impl Drop for WriterGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl Writers {
    /// Count a writer in until the returned guard is dropped.
    pub fn start(&self) -> WriterGuard {
        self.0.send_modify(|n| *n += 1);
        WriterGuard(self.0.clone())
    }

    /// Wait until no writer runs.
    pub async fn idle(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// The worker loop. `reader` is the session opened for it under the snapshot; `index` is the
/// worker's place in the order the harm budget's governor lets workers start chunks.
pub async fn run(
    ctx: Arc<WorkerContext>,
    index: usize,
    reader: Box<dyn ChunkReader>,
) -> Result<()> {
    let mut reader = Some(reader);
    loop {
        if failpoint::armed() {
            // A `wait` blocks its thread: off the runtime's, so the governor keeps stepping.
            tokio::task::spawn_blocking(|| failpoint::hit("budget.before_chunk"))
                .await
                .map_err(|e| Error::internal(format!("failpoint task: {e}")))??;
        }
        if !ctx.gate.admit(index, || ctx.queue.remaining() == 0).await {
            break;
        }
        let Some(chunk) = ctx.queue.next()? else {
            break;
        };
        let mut attempt = 1;
        let mut first_failure: Option<Instant> = None;
        loop {
            let mut session = match reader.take() {
                Some(r) => r,
                None => reopen(&ctx).await?,
            };
            let began = Instant::now();
            match export_chunk(&ctx, session.as_mut(), &chunk).await {
                Ok(record) => {
                    let took = began.elapsed().as_millis() as u64;
                    ctx.longest_read_ms.fetch_max(took, Ordering::Relaxed);
                    reader = Some(session);
                    ctx.parts_done.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut c) = ctx.committed.lock() {
                        c.push(record);
                    }
                    break;
                }
                Err(e) => {
                    // A source error may leave the session in an aborted transaction: never
                    // reuse it. Other failures (destination, data) leave it usable.
                    if e.kind() != ErrorKind::Source {
                        reader = Some(session);
                    }
                    if !e.is_transient() {
                        return Err(e);
                    }
                    let since = *first_failure.get_or_insert_with(Instant::now);
                    if !ctx.retry.allows(attempt, since) {
                        return Err(e.context(format!("gave up after {attempt} attempts")));
                    }
                    let delay = ctx.retry.delay(attempt);
                    // The error names the part already (readers name their chunk, writers
                    // their file): a prefix here would say it twice.
                    tracing::warn!(
                        "{e} — retrying in {} ms (attempt {} of {})",
                        delay.as_millis(),
                        attempt + 1,
                        ctx.retry.max_attempts
                    );
                    ctx.retries.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
            }
        }
    }
    Ok(())
}

/// Open a replacement session, retrying transient failures.
async fn reopen(ctx: &WorkerContext) -> Result<Box<dyn ChunkReader>> {
    let mut attempt = 1;
    let since = Instant::now();
    loop {
        let r = ctx.coordinator.lock().await.reopen_reader().await;
        match r {
            Ok(r) => return Ok(r),
            Err(e) if e.is_transient() && ctx.retry.allows(attempt, since) => {
                tokio::time::sleep(ctx.retry.delay(attempt)).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Read one chunk into one committed part and write its receipt.
async fn export_chunk(
    ctx: &WorkerContext,
    reader: &mut dyn ChunkReader,
    chunk: &Chunk,
) -> Result<PartRecord> {
    let ds = ctx
        .datasets
        .get(&chunk.dataset)
        .ok_or_else(|| Error::internal(format!("chunk of unknown dataset {}", chunk.dataset)))?;
    let path = match &ctx.part_tag {
        Some(tag) => layout::table_part_path(&ds.name, chunk.ordinal, tag),
        None => layout::part_path(&ds.name, chunk.ordinal, ctx.format.extension()),
    };
    let (tx, mut rx) = mpsc::channel::<RecordBatch>(1);
    // Written batches go back to the reader, which reuses their memory.
    let (back_tx, back_rx) = std::sync::mpsc::sync_channel::<RecordBatch>(2);
    let (commit_tx, commit_rx) = oneshot::channel::<bool>();
    let writer = {
        let dest = ctx.destination.clone();
        let format = ctx.format.for_part(chunk.ordinal, ctx.merge);
        let schema = ds.arrow_schema();
        let path = path.clone();
        let key = PartKey {
            dataset: ds.name.clone(),
            ordinal: chunk.ordinal,
        };
        let running = ctx.writers.start();
        tokio::task::spawn_blocking(move || -> Result<PartStats> {
            let _running = running;
            let object = dest.create(&path)?;
            let mut part = open_part(&format, key, schema, object, &path)?;
            while let Some(batch) = rx.blocking_recv() {
                if let Err(e) = part
                    .write(&batch)
                    .and_then(|()| failpoint::hit_as("export.after_batch", ErrorKind::Destination))
                {
                    part.abort();
                    return Err(e);
                }
                let _ = back_tx.try_send(batch);
            }
            match commit_rx.blocking_recv() {
                Ok(true) => {
                    if let Err(e) =
                        failpoint::hit_as("export.before_commit", ErrorKind::Destination)
                    {
                        part.abort();
                        return Err(e);
                    }
                    part.finish()
                }
                _ => {
                    part.abort();
                    Err(Error::interrupted("part aborted"))
                }
            }
        })
    };
    let sender = BatchSender::new(tx, ctx.counters.clone(), ctx.batch_bytes).with_returns(back_rx);
    let read = reader.read(ds, chunk, &sender).await;
    drop(sender);
    let joined = |r: std::result::Result<Result<PartStats>, tokio::task::JoinError>| {
        r.map_err(|e| Error::internal(format!("the part writer failed: {e}")))?
    };
    let stats = match read {
        Ok(stats) => {
            let _ = commit_tx.send(true);
            let part = joined(writer.await)?;
            if part.rows != stats.rows {
                return Err(Error::internal(format!(
                    "{path}: read {} rows but wrote {}",
                    stats.rows, part.rows
                )));
            }
            part
        }
        Err(read_err) => {
            drop(commit_tx);
            // A writer failure (disk full) makes the reader fail with "writer stopped"; the
            // writer's error is the one that explains it.
            return match joined(writer.await) {
                Err(w) if w.kind() != ErrorKind::Interrupted => Err(w),
                _ => Err(read_err),
            };
        }
    };
    let record = PartRecord {
        dataset: ds.name.clone(),
        ordinal: chunk.ordinal,
        file: path,
        rows: stats.rows,
        bytes: stats.bytes,
        xxh3_128: stats.xxh3_128,
        snapshot: ctx.snapshot_index,
        range: chunk.bounds.to_string(),
    };
    let receipt = serde_json::to_vec_pretty(&record).map_err(|e| Error::internal(e.to_string()))?;
    let receipt_path = layout::receipt_path(&ds.name, chunk.ordinal);
    failpoint::hit_as("export.before_receipt", ErrorKind::Destination)?;
    ctx.destination.put(&receipt_path, receipt).await?;
    failpoint::hit_as("export.after_receipt", ErrorKind::Destination)?;
    Ok(record)
}
