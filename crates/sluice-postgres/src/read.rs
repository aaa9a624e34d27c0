//! Streaming one chunk: `COPY (SELECT …) TO STDOUT (FORMAT binary)` decoded into Arrow batches
//! cut by bytes.
//!
//! A reader is one worker session. In snapshot consistency it lives inside a REPEATABLE READ
//! READ ONLY transaction that imported the coordinator's snapshot; in chunk consistency each
//! COPY runs on its own (autocommit), so each chunk is its own short snapshot. After any error
//! the session may sit in an aborted transaction, so the engine discards it and opens a new
//! one.

use crate::chunking::from_clause;
use crate::connect::PgTarget;
use crate::decode::{Fed, TupleDecoder};
use crate::error::{Phase, classify};
use crate::sql::{quote_ident, quote_literal};
use async_trait::async_trait;
use futures_util::{StreamExt, pin_mut};
use sluice_core::{
    BatchSender, Chunk, ChunkBounds, ChunkReader, Dataset, Error, ReadStats, Result,
};
use tokio_postgres::Client;

/// One worker session.
pub struct PgReader {
    client: Client,
    /// Connects the cancel request over the session's kind of channel (TLS or not).
    pg: PgTarget,
    target: String,
    pid: u32,
}

impl PgReader {
    /// Open a worker session; with `snapshot`, join that exported snapshot.
    pub async fn open(pg: &PgTarget, tag: &str, snapshot: Option<&str>) -> Result<Self> {
        let client = pg.connect(tag).await?;
        let target = pg.display().to_string();
        if let Some(id) = snapshot {
            client
                .batch_execute(&format!(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
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
            pid: pid as u32,
        })
    }
}

/// The WHERE clause selecting `bounds` (empty for the whole relation).
fn predicate(ds: &Dataset, bounds: &ChunkBounds) -> Result<String> {
    Ok(match bounds {
        ChunkBounds::Whole => String::new(),
        ChunkBounds::Pages { first, end } => {
            let mut w = format!(" WHERE ctid >= '({first},0)'::tid");
            if let Some(e) = end {
                w.push_str(&format!(" AND ctid < '({e},0)'::tid"));
            }
            w
        }
        ChunkBounds::Keys {
            columns,
            lower,
            upper,
        } => {
            let mut types = Vec::new();
            for c in columns {
                let d = ds.columns.iter().find(|d| &d.name == c).ok_or_else(|| {
                    Error::config(format!("key column {c:?} is not a column of {}", ds.name))
                })?;
                types.push((quote_ident(c), d.source_type.clone(), d.field.is_nullable()));
            }
            let row = format!(
                "({})",
                types
                    .iter()
                    .map(|t| t.0.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let lit = |vals: &Vec<String>| -> String {
                let parts: Vec<String> = vals
                    .iter()
                    .zip(&types)
                    .map(|(v, t)| format!("{}::{}", quote_literal(v), t.1))
                    .collect();
                format!("({})", parts.join(", "))
            };
            let mut conds: Vec<String> = types
                .iter()
                .filter(|t| t.2)
                .map(|t| format!("{} IS NOT NULL", t.0))
                .collect();
            if let Some(l) = lower {
                conds.push(format!("{row} >= {}", lit(l)));
            }
            if let Some(u) = upper {
                conds.push(format!("{row} < {}", lit(u)));
            }
            if conds.is_empty() {
                String::new()
            } else {
                format!(" WHERE {}", conds.join(" AND "))
            }
        }
        ChunkBounds::KeyNulls { columns } => {
            let any: Vec<String> = columns
                .iter()
                .map(|c| format!("{} IS NULL", quote_ident(c)))
                .collect();
            format!(" WHERE ({})", any.join(" OR "))
        }
    })
}

/// The COPY statement that streams `chunk` of `ds`.
pub fn copy_sql(ds: &Dataset, chunk: &Chunk) -> Result<String> {
    let cols: Vec<String> = ds
        .columns
        .iter()
        .map(|c| {
            let q = quote_ident(&c.name);
            match &c.cast {
                Some(t) => format!("{q}::{t} AS {q}"),
                None => q,
            }
        })
        .collect();
    let from = from_clause(ds, chunk.relation.as_ref())?;
    let pred = predicate(ds, &chunk.bounds)?;
    Ok(format!(
        "COPY (SELECT {} FROM {from}{pred}) TO STDOUT (FORMAT binary)",
        cols.join(", ")
    ))
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
        let sql = copy_sql(ds, chunk)?;
        let what = format!("{} part {}", ds.name, chunk.ordinal);
        tracing::debug!(target: "sluice::read", "{what}: {sql}");
        let mut dec = TupleDecoder::new(ds.arrow_schema())
            .map_err(|e| Error::internal(format!("{what}: {}", e.0)))?;
        let stream = self
            .client
            .copy_out(sql.as_str())
            .await
            .map_err(|e| classify(e, Phase::Read, &self.target).context(&what))?;
        pin_mut!(stream);
        let budget = out.batch_bytes();
        let mut stats = ReadStats::default();
        let mut unreported_wire = 0u64;
        let mut sent = false;
        let mut done = false;
        while let Some(msg) = stream.next().await {
            let msg = msg.map_err(|e| classify(e, Phase::Read, &self.target).context(&what))?;
            stats.wire_bytes += msg.len() as u64;
            unreported_wire += msg.len() as u64;
            match dec.feed(&msg) {
                Ok(Fed::Done) => done = true,
                Ok(Fed::More) => {}
                Err(e) => {
                    self.cancel().await;
                    let col = dec
                        .failed_column()
                        .and_then(|f| ds.columns.iter().find(|c| c.name == *f.name()))
                        .map(|c| format!(" column {:?} ({})", c.name, c.source_type))
                        .unwrap_or_default();
                    return Err(Error::data(format!(
                        "{what}{col}, row {}: {}.",
                        stats.rows + dec.rows() as u64 + 1,
                        e.0
                    )));
                }
            }
            if dec.buffered_bytes() >= budget {
                let batch = dec.finish_batch().map_err(|e| e.context(&what))?;
                let rows = batch.num_rows() as u64;
                stats.rows += rows;
                out.progress(rows, std::mem::take(&mut unreported_wire));
                if out.send(batch).await.is_err() {
                    self.cancel().await;
                    return Err(Error::interrupted(format!("{what}: the writer stopped")));
                }
                // The writer has finished the batch before this one: reuse its memory.
                if let Some(done) = out.recycled() {
                    dec.recycle(done);
                }
                sent = true;
            }
        }
        if !done || dec.has_partial() {
            return Err(Error::source_transient(format!(
                "{what}: the COPY stream from {} ended before its end marker",
                self.target
            )));
        }
        if dec.rows() > 0 || !sent {
            let batch = dec.finish_batch().map_err(|e| e.context(&what))?;
            let rows = batch.num_rows() as u64;
            stats.rows += rows;
            out.progress(rows, unreported_wire);
            if out.send(batch).await.is_err() {
                return Err(Error::interrupted(format!("{what}: the writer stopped")));
            }
        }
        Ok(stats)
    }

    fn session_id(&self) -> Option<u64> {
        Some(self.pid as u64)
    }
}
