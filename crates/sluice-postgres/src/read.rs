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

use crate::chunking::from_clause;
use crate::connect::PgTarget;
use crate::decode::{Fed, Findings, TupleDecoder};
use crate::error::{Phase, classify, sqlstate};
use crate::harm::exclusive_lockers;
use crate::sql::{quote_ident, quote_literal, quote_table};
use async_trait::async_trait;
use futures_util::{StreamExt, pin_mut};
use sluice_core::table::TableRef;
use sluice_core::{
    BatchSender, Chunk, ChunkBounds, ChunkReader, Dataset, Error, ReadStats, Result,
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
        self.lock_nowait(ds, chunk).await?;
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
