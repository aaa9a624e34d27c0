//! Streaming one chunk: a SELECT over the chunk's pointer pages (or key range), rows decoded
//! into Arrow batches cut by bytes.
//!
//! A reader is one worker attachment on a thread of its own (see `connect.rs`). In snapshot
//! consistency it reads inside a READ ONLY SNAPSHOT transaction that joined the coordinator's
//! snapshot by number (`SET TRANSACTION … SNAPSHOT AT NUMBER n`), for the whole run; in chunk
//! consistency each chunk starts and commits its own snapshot transaction.
//!
//! Memory: the session thread fills one batch, hands it over and waits until the writer has
//! taken it (the writer then hands back the previous batch's memory) before it fills the next,
//! so a worker holds about two batches, as with every other source.

use crate::chunking::{from_clause, predicate};
use crate::connect::{FbConn, FbTarget, Session};
use crate::decode::RowDecoder;
use crate::error::{Phase, classify};
use crate::sql::quote_ident;
use crate::types::select_expr;
use arrow_array::RecordBatch;
use async_trait::async_trait;
use sluice_core::{BatchSender, Chunk, ChunkReader, Dataset, Error, ReadStats, Result};

/// The transaction a chunk-consistency read runs in.
const CHUNK_TRANSACTION: &str = "SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT";

/// The statement that joins snapshot `number`.
pub fn join_snapshot_sql(number: u64) -> String {
    format!("SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT AT NUMBER {number}")
}

/// One worker session.
pub struct FbReader {
    session: Session,
    /// `None` in chunk consistency.
    snapshot: Option<u64>,
}

impl FbReader {
    /// Attach; with `snapshot`, join that snapshot number for the session's lifetime.
    pub async fn open(target: &FbTarget, tag: &str, snapshot: Option<u64>) -> Result<Self> {
        let session = target.open(tag).await?;
        if let Some(n) = snapshot {
            let display = target.display().to_string();
            session
                .call(move |c| c.begin(&join_snapshot_sql(n)))
                .await?
                .map_err(|e| {
                    classify(e, Phase::Snapshot, &display)
                        .context(format!("joining snapshot number {n}"))
                })?;
        }
        Ok(FbReader { session, snapshot })
    }
}

/// The SELECT that reads `chunk` of `ds`.
pub fn select_sql(ds: &Dataset, chunk: &Chunk) -> Result<String> {
    let cols: Vec<String> = ds
        .columns
        .iter()
        .map(|c| select_expr(&quote_ident(&c.name), c.cast.as_deref()))
        .collect();
    Ok(format!(
        "SELECT {} FROM {}{}",
        cols.join(", "),
        from_clause(ds)?,
        predicate(ds, &chunk.bounds)?
    ))
}

enum Msg {
    Batch(RecordBatch, u64, u64),
    Done(ReadStats),
    Failed(Error),
}

/// Runs on the session thread: stream `sql` into batches, handing each over and waiting for
/// the writer before filling the next.
#[allow(clippy::too_many_arguments)]
fn stream(
    conn: &mut FbConn,
    sql: &str,
    schema: arrow_schema::SchemaRef,
    budget: usize,
    own_transaction: bool,
    what: &str,
    column_names: &[String],
    batches: &tokio::sync::mpsc::Sender<Msg>,
    acks: &std::sync::mpsc::Receiver<Option<RecordBatch>>,
) -> Result<ReadStats> {
    let display = conn.display().to_string();
    if own_transaction {
        conn.begin(CHUNK_TRANSACTION)
            .map_err(|e| classify(e, Phase::Snapshot, &display).context(what))?;
    }
    let mut dec = RowDecoder::new(schema)?;
    let mut stats = ReadStats::default();
    let mut unreported = 0u64;
    let mut failure: Option<Error> = None;
    let mut sent = false;
    let hand_over = |dec: &mut RowDecoder, stats: &mut ReadStats, unreported: &mut u64| {
        let batch = dec.finish_batch()?;
        let rows = batch.num_rows() as u64;
        stats.rows += rows;
        let stopped = || Error::interrupted(format!("{what}: the writer stopped"));
        batches
            .blocking_send(Msg::Batch(batch, rows, std::mem::take(unreported)))
            .map_err(|_| stopped())?;
        match acks.recv() {
            Ok(Some(done)) => dec.recycle(done),
            Ok(None) => {}
            Err(_) => return Err(stopped()),
        }
        Ok::<(), Error>(())
    };
    let fetched = conn.for_each_row(sql, vec![], |row| {
        match dec.push_row(row) {
            Ok(n) => {
                stats.wire_bytes += n as u64;
                unreported += n as u64;
            }
            Err(e) => {
                let col = column_names.get(e.column).cloned().unwrap_or_default();
                failure = Some(Error::data(format!(
                    "{what} column {col:?}, row {}: {}.",
                    stats.rows + dec.rows() as u64 + 1,
                    e.message
                )));
                return false;
            }
        }
        if dec.buffered_bytes() >= budget {
            if let Err(e) = hand_over(&mut dec, &mut stats, &mut unreported) {
                failure = Some(e);
                return false;
            }
            sent = true;
        }
        true
    });
    if let Some(f) = failure {
        return Err(f);
    }
    fetched.map_err(|e| classify(e, Phase::Read, &display).context(what))?;
    if dec.rows() > 0 || !sent {
        hand_over(&mut dec, &mut stats, &mut unreported)?;
    }
    if own_transaction {
        conn.commit()
            .map_err(|e| classify(e, Phase::Read, &display).context(what))?;
    }
    Ok(stats)
}

#[async_trait]
impl ChunkReader for FbReader {
    async fn read(&mut self, ds: &Dataset, chunk: &Chunk, out: &BatchSender) -> Result<ReadStats> {
        let sql = select_sql(ds, chunk)?;
        let what = format!("{} part {}", ds.name, chunk.ordinal);
        tracing::debug!(target: "sluice::read", "{what}: {sql}");
        let (btx, mut brx) = tokio::sync::mpsc::channel::<Msg>(1);
        let (atx, arx) = std::sync::mpsc::channel::<Option<RecordBatch>>();
        let schema = ds.arrow_schema();
        let budget = out.batch_bytes();
        let own = self.snapshot.is_none();
        let names: Vec<String> = ds.columns.iter().map(|c| c.name.clone()).collect();
        let job_what = what.clone();
        self.session.submit(move |conn| {
            let r = stream(
                conn, &sql, schema, budget, own, &job_what, &names, &btx, &arx,
            );
            if r.is_err() && own {
                let _ = conn.commit();
            }
            let _ = btx.blocking_send(match r {
                Ok(s) => Msg::Done(s),
                Err(e) => Msg::Failed(e),
            });
        })?;
        loop {
            match brx.recv().await {
                Some(Msg::Batch(batch, rows, bytes)) => {
                    out.progress(rows, bytes);
                    if out.send(batch).await.is_err() {
                        return Err(Error::interrupted(format!("{what}: the writer stopped")));
                    }
                    // The writer has finished the batch before this one: reuse its memory.
                    let _ = atx.send(out.recycled());
                }
                Some(Msg::Done(stats)) => return Ok(stats),
                Some(Msg::Failed(e)) => return Err(e),
                None => {
                    return Err(Error::source_transient(format!(
                        "{what}: the Firebird session ended during the read"
                    )));
                }
            }
        }
    }

    fn session_id(&self) -> Option<u64> {
        Some(self.session.attachment_id())
    }
}
