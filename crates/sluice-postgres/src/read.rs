//! Streaming one chunk: `COPY (SELECT …) TO STDOUT (FORMAT binary)` decoded into Arrow batches
//! cut by bytes.
//!
//! A reader is one worker session. In snapshot consistency it lives inside a REPEATABLE READ
//! READ ONLY transaction that imported the coordinator's snapshot; in chunk consistency each
//! COPY runs on its own (autocommit), so each chunk is its own short snapshot. After any error
//! the session may sit in an aborted transaction, so the engine discards it and opens a new
//! one.
//!
//! In snapshot consistency a worker takes its ACCESS SHARE lock on a relation with `NOWAIT`
//! before its first COPY of it, as pg_dump's parallel workers do. The coordinator holds that
//! lock for the whole run, so an `ALTER TABLE` (ACCESS EXCLUSIVE) that arrives meanwhile waits
//! for the run to end — and a worker that asks for the lock after it queues behind the ALTER:
//! neither can proceed. Waiting `lock_timeout` and retrying cannot help (every session reading
//! the table is stuck behind the ALTER meanwhile), so the worker fails at once, naming the
//! waiting session, its statement and the ways out.

use crate::connect::PgTarget;
use crate::decode::{Fed, Findings, TupleDecoder};
use crate::error::{Phase, classify, sqlstate};
use crate::harm::exclusive_lockers;
use crate::sql::{PgDialect, quote_ident, quote_literal, quote_table};
use async_trait::async_trait;
use futures_util::{StreamExt, pin_mut};
use sluice_core::batch::value_error;
use sluice_core::clause;
use sluice_core::table::TableRef;
use sluice_core::{
    BatchSender, Chunk, ChunkReader, Dataset, Decoder, Error, ReadLoop, ReadStats, Result,
};
use std::collections::HashSet;
use std::sync::Arc;
use tokio_postgres::Client;

/// One worker session.
pub struct PgReader {
    client: Client,
    /// Connects the cancel request over the session's kind of channel (TLS or not).
    pg: PgTarget,
    target: String,
    tag: String,
    pid: u32,
    /// In snapshot consistency, the relations `LOCK TABLE` accepts (tables, partitioned tables,
    /// views, and leaf partitions that are tables): locked with NOWAIT before the first read.
    lockable: Option<Arc<HashSet<TableRef>>>,
    /// Relations this session has locked.
    locked: HashSet<TableRef>,
    /// Where values changed to fit their Arrow type are counted.
    findings: Findings,
}

impl PgReader {
    /// Open a worker session; with `snapshot`, join that exported snapshot and lock each
    /// relation of `lockable` with NOWAIT before reading it.
    pub async fn open(
        pg: &PgTarget,
        tag: &str,
        snapshot: Option<&str>,
        lockable: Option<Arc<HashSet<TableRef>>>,
        findings: Findings,
    ) -> Result<Self> {
        let client = pg.connect(tag).await?;
        let target = pg.display().to_string();
        if let Some(id) = snapshot {
            // A worker waits in its transaction while its writer is slow (an object store)
            // or a stream's snapshot hand-off holds it; the snapshot is held by the
            // coordinator anyway, so the server's idle-in-transaction limit would only kill
            // the worker, not free anything.
            client
                .batch_execute(&format!(
                    "SET idle_in_transaction_session_timeout = 0; \
                     BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
                    quote_literal(id)
                ))
                .await
                .map_err(|e| classify(e, Phase::Snapshot, &target))?;
        }
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .map_err(|e| classify(e, Phase::Snapshot, &target))?
            .get(0);
        Ok(PgReader {
            client,
            pg: pg.clone(),
            target,
            tag: tag.to_string(),
            pid: pid as u32,
            lockable: snapshot.and(lockable),
            locked: HashSet::new(),
            findings,
        })
    }

    /// Take this session's ACCESS SHARE lock on the relation `chunk` reads, without waiting
    /// (see the module doc); fails permanently, naming who is in the way, if a session waits
    /// for an exclusive lock on it.
    async fn lock_nowait(&mut self, ds: &Dataset, chunk: &Chunk) -> Result<()> {
        let Some(rel) = chunk.relation.as_ref().or(ds.object.as_ref()) else {
            return Ok(());
        };
        let lockable = self.lockable.as_ref().is_some_and(|l| l.contains(rel));
        if !lockable || self.locked.contains(rel) {
            return Ok(());
        }
        let only = if chunk.relation.is_some() {
            "ONLY "
        } else {
            ""
        };
        let sql = format!(
            "SAVEPOINT sluice_lock; LOCK TABLE {only}{} IN ACCESS SHARE MODE NOWAIT; \
             RELEASE SAVEPOINT sluice_lock",
            quote_table(rel)
        );
        match self.client.batch_execute(&sql).await {
            Ok(()) => {
                self.locked.insert(rel.clone());
                Ok(())
            }
            Err(e) if sqlstate(&e) == Some("55P03") => {
                let _ = self
                    .client
                    .batch_execute("ROLLBACK TO SAVEPOINT sluice_lock")
                    .await;
                let who = exclusive_lockers(
                    &self.client,
                    &[quote_table(rel)],
                    &self.pg.sessions(&self.tag),
                )
                .await;
                Err(queued_ddl(ds, chunk, rel, &who))
            }
            Err(e) => Err(classify(e, Phase::Read, &ds.name)
                .context(format!("{} part {}: locking {rel}", ds.name, chunk.ordinal))),
        }
    }
}

/// The error of a worker that found DDL queued behind the export's lock.
fn queued_ddl(
    ds: &Dataset,
    chunk: &Chunk,
    rel: &TableRef,
    who: &[crate::harm::Exclusive],
) -> Error {
    let waiting = if who.is_empty() {
        String::new()
    } else {
        format!(
            " — {}",
            who.iter()
                .map(|w| w.describe())
                .collect::<Vec<_>>()
                .join("; ")
        )
    };
    let cancel = who
        .iter()
        .find(|w| !w.granted)
        .map(|w| format!("SELECT pg_cancel_backend({})", w.pid))
        .unwrap_or_else(|| "pg_cancel_backend(<pid>)".into());
    Error::source_permanent(format!(
        "{} part {}: another session is waiting for an ACCESS EXCLUSIVE lock on {rel} (DDL \
         such as ALTER, TRUNCATE, DROP, VACUUM FULL){waiting}. It queued behind the ACCESS SHARE lock this \
         export holds on {rel} for its whole snapshot (as pg_dump does, so TRUNCATE and table \
         rewrites cannot break the snapshot), and every new reader of {rel} now queues behind \
         it — this export's next worker included — so neither can go on. The export stops now \
         and releases its locks so that statement, and the sessions queued behind it, proceed. \
         Way out: let the statement finish, then run the same command with --resume (only the \
         missing parts are read); or cancel it ({cancel}) and run it after the export; or \
         export with --consistency chunk, which holds no lock between chunks. DDL that must \
         not wait for exports can set lock_timeout.",
        ds.name, chunk.ordinal
    ))
}

/// The COPY statement that streams `chunk` of `ds`.
pub fn copy_sql(ds: &Dataset, chunk: &Chunk) -> Result<String> {
    let select = clause::select_chunk(
        &PgDialect,
        ds,
        chunk.relation.as_ref(),
        &chunk.bounds,
        |c| {
            let q = quote_ident(&c.name);
            match &c.cast {
                Some(t) => format!("{q}::{t} AS {q}"),
                None => q,
            }
        },
    )?;
    Ok(format!("COPY ({select}) TO STDOUT (FORMAT binary)"))
}

impl Decoder for TupleDecoder {
    fn rows(&self) -> usize {
        TupleDecoder::rows(self)
    }
    fn buffered_bytes(&self) -> usize {
        TupleDecoder::buffered_bytes(self)
    }
    fn finish_batch(&mut self) -> Result<arrow_array::RecordBatch> {
        TupleDecoder::finish_batch(self)
    }
    fn recycle(&mut self, batch: arrow_array::RecordBatch) {
        TupleDecoder::recycle(self, batch)
    }
}

impl PgReader {
    async fn cancel(&self) {
        if let Err(e) = self.pg.cancel(self.client.cancel_token()).await {
            tracing::debug!("cancelling a COPY failed: {e}");
        }
    }
}

#[async_trait]
impl ChunkReader for PgReader {
    async fn read(&mut self, ds: &Dataset, chunk: &Chunk, out: &BatchSender) -> Result<ReadStats> {
        self.lock_nowait(ds, chunk).await?;
        let sql = copy_sql(ds, chunk)?;
        let what = format!("{} part {}", ds.name, chunk.ordinal);
        tracing::debug!(target: "sluice::read", "{what}: {}", sluice_core::clause::for_log(&sql));
        let mut dec = TupleDecoder::new(ds.arrow_schema())
            .map_err(|e| Error::internal(format!("{what}: {}", e.0)))?;
        let stream = self
            .client
            .copy_out(sql.as_str())
            .await
            .map_err(|e| classify(e, Phase::Read, &self.target).context(&what))?;
        pin_mut!(stream);
        let mut batches = ReadLoop::new(out, &what);
        let mut done = false;
        while let Some(msg) = stream.next().await {
            let msg = msg.map_err(|e| classify(e, Phase::Read, &self.target).context(&what))?;
            batches.received(msg.len() as u64);
            match dec.feed(&msg) {
                Ok(Fed::Done) => done = true,
                Ok(Fed::More) => {}
                Err(e) => {
                    self.cancel().await;
                    let col = dec
                        .failed_column()
                        .and_then(|f| ds.columns.iter().find(|c| c.name == *f.name()));
                    return Err(value_error(&what, col, batches.row_number(&dec), &e.0));
                }
            }
            if let Err(e) = batches.step(&mut dec).await {
                // The COPY would go on streaming into a dropped result: stop it.
                self.cancel().await;
                return Err(e);
            }
        }
        if !done || dec.has_partial() {
            return Err(Error::source_transient(format!(
                "{what}: the COPY stream from {} ended before its end marker",
                self.target
            )));
        }
        let stats = batches.finish(&mut dec).await?;
        for (i, n) in dec.adjusted().iter().enumerate() {
            if let Some(c) = ds.columns.get(i) {
                self.findings.add(&ds.name, &c.name, *n);
            }
        }
        Ok(stats)
    }

    fn session_id(&self) -> Option<u64> {
        Some(self.pid as u64)
    }
}
