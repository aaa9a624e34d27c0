//! Streaming one chunk: a `SELECT` whose rows are decoded into Arrow batches cut by bytes.
//!
//! A reader is one worker session. In snapshot consistency it lives inside a `START TRANSACTION
//! WITH CONSISTENT SNAPSHOT, READ ONLY` begun while the coordinator held the global lock; in
//! chunk consistency each `SELECT` runs on its own (autocommit), so each chunk is its own
//! consistent read. Rows are pulled from the socket one at a time (the driver's row stream,
//! never a buffered result set), so memory is the batch being built plus the socket buffers.
//! After a source error the session is discarded; after a destination error it is kept (the
//! driver drains an unfinished result before the next statement).
//!
//! Every table a snapshot reader has read stays under a shared metadata lock until its
//! transaction ends (the end of the run); the reader records them in the run's lock book for
//! the harm probe. A DDL queued on such a table makes *our own* next read of it wait behind the
//! DDL, which waits for us: that wait ends at `lock_wait_timeout` (`--lock-wait-timeout`) with
//! a permanent error telling the user to let the DDL through and `--resume` (retrying in the
//! same snapshot could only wait again).

use crate::connect::{Protocol, Sessions, ZeroDates};
use crate::decode::{Adjustments, RowDecoder};
use crate::error::{Phase, classify, code, server_code};
use crate::sql::{MyDialect, quote_ident};
use async_trait::async_trait;
use futures_util::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, QueryResult, Row};
use sluice_core::batch::value_error;
use sluice_core::clause;
use sluice_core::table::TableRef;
use sluice_core::{
    BatchSender, Chunk, ChunkReader, Dataset, Decoder, Error, ReadLoop, ReadStats, Result,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// What readers had to change in the data (zero dates, stripped SRIDs), per dataset, for the
/// report. Counted only for chunks read to the end.
#[derive(Debug, Clone, Default)]
pub struct Findings(Arc<Mutex<BTreeMap<String, Adjustments>>>);

impl Findings {
    fn add(&self, dataset: &str, a: &Adjustments) {
        if a.is_empty() {
            return;
        }
        if let Ok(mut m) = self.0.lock() {
            m.entry(dataset.to_string()).or_default().merge(a);
        }
    }

    /// One report line per dataset column with something to say.
    pub fn notes(&self, datasets: &[Dataset]) -> Vec<String> {
        let Ok(m) = self.0.lock() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (name, adj) in m.iter() {
            let col = |i: &usize| {
                datasets
                    .iter()
                    .find(|d| &d.name == name)
                    .and_then(|d| d.columns.get(*i))
                    .map(|c| c.name.clone())
                    .unwrap_or_else(|| format!("#{i}"))
            };
            for (i, n) in &adj.zero_dates {
                out.push(format!(
                    "{name}.{}: {n} zero or invalid date(s) (such as 0000-00-00) exported as \
                     NULL; add ?zero_dates=error to the URL to fail instead",
                    col(i)
                ));
            }
            for (i, srids) in &adj.srids {
                let list = srids
                    .iter()
                    .map(|(s, n)| format!("SRID {s}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                out.push(format!(
                    "{name}.{}: geometry exported as WKB without its SRID ({list}); export \
                     ST_SRID(column) alongside with --query if you need it",
                    col(i)
                ));
            }
        }
        out
    }
}

/// How a reader's session is set up, shared by all readers of a run.
#[derive(Debug, Clone)]
pub struct ReaderSetup {
    /// The redacted URL, for messages.
    pub target: String,
    /// Row protocol.
    pub protocol: Protocol,
    /// Zero-date policy.
    pub zero_dates: ZeroDates,
    /// Values the readers had to change, for the report.
    pub findings: Findings,
    /// The run's session registry (its lock book is kept up to date).
    pub sessions: Sessions,
    /// True when the session lives inside the shared snapshot's transaction.
    pub snapshot: bool,
    /// The session's `lock_wait_timeout`, for messages.
    pub lock_wait_seconds: u64,
    /// Datasets in non-transactional engines (MyISAM…), whose reads wait for table locks.
    pub non_transactional: Arc<std::collections::HashSet<String>>,
    /// True when those tables are held under READ locks for the run
    /// (`--lock-non-transactional`): their reads then jump the queue of writers waiting for
    /// the table (`SELECT HIGH_PRIORITY`), who wait for the run anyway and would otherwise
    /// make our reads wait behind them while they wait for us.
    pub high_priority: bool,
}

/// One worker session.
pub struct MyReader {
    conn: Conn,
    setup: ReaderSetup,
    /// Tables this session's snapshot transaction holds metadata locks on.
    held: BTreeSet<TableRef>,
}

impl MyReader {
    /// Wrap an open session (already inside the snapshot transaction, in snapshot consistency).
    pub fn new(conn: Conn, setup: ReaderSetup) -> Self {
        MyReader {
            conn,
            setup,
            held: BTreeSet::new(),
        }
    }

    /// Classify a read error; a metadata-lock timeout inside the snapshot gets its own advice.
    fn read_error(setup: &ReaderSetup, e: mysql_async::Error, ds: &Dataset, what: &str) -> Error {
        let timed_out = server_code(&e) == Some(code::ER_LOCK_WAIT_TIMEOUT);
        if timed_out && setup.non_transactional.contains(&ds.name) {
            return Error::source_permanent(format!(
                "{what}: waited {} s (--lock-wait-timeout) for a lock on {}, a table without \
                 transactions: another session is writing it (such tables are locked whole for \
                 each write), or a DDL statement is queued on it. Raise --lock-wait-timeout to \
                 wait longer for its writers, or export it when they are done; the parts \
                 written are kept for --resume.",
                setup.lock_wait_seconds, ds.name
            ))
            .with_cause(e);
        }
        if setup.snapshot && timed_out {
            return Error::source_permanent(format!(
                "{what}: waited {} s (--lock-wait-timeout) for the metadata lock on {}: a DDL \
                 statement (ALTER, TRUNCATE, RENAME…) is queued on that table behind this \
                 export's own snapshot, which holds a metadata lock on every table it has read \
                 until the run ends, and every other query on the table waits behind that DDL. \
                 The export stops here so its locks are released and the DDL can run. Run the \
                 same command with --resume afterwards (the parts written are kept), and avoid \
                 DDL on exported tables while an export runs.",
                setup.lock_wait_seconds, ds.name
            ))
            .with_cause(e);
        }
        classify(e, Phase::Read, &setup.target).context(what)
    }
}

impl Drop for MyReader {
    fn drop(&mut self) {
        // The session closes with the reader: its transaction's metadata locks go with it.
        let held = std::mem::take(&mut self.held);
        self.setup
            .sessions
            .locks(|b| held.iter().for_each(|t| b.release(t)));
    }
}

impl MyReader {
    async fn stream(
        &mut self,
        ds: &Dataset,
        sql: &str,
        dec: &mut RowDecoder,
        out: &BatchSender,
        what: &str,
    ) -> Result<ReadStats> {
        match self.setup.protocol {
            Protocol::Binary => match self.conn.exec_iter(sql, ()).await {
                Ok(result) => drain(result, dec, ds, out, what, &self.setup.target).await,
                Err(e) => Err(Self::read_error(&self.setup, e, ds, what)),
            },
            Protocol::Text => match self.conn.query_iter(sql).await {
                Ok(result) => drain(result, dec, ds, out, what, &self.setup.target).await,
                Err(e) => Err(Self::read_error(&self.setup, e, ds, what)),
            },
        }
    }
}

/// The SELECT that streams `chunk` of `ds`; `high_priority` lets it pass writers queued for a
/// table-level lock (MyISAM, Aria, MEMORY; no effect on InnoDB).
pub fn select_sql(ds: &Dataset, chunk: &Chunk, high_priority: bool) -> Result<String> {
    let select = clause::select_chunk(
        &MyDialect,
        ds,
        chunk.relation.as_ref(),
        &chunk.bounds,
        |c| {
            let q = quote_ident(&c.name);
            match c.cast.as_deref() {
                Some("CHAR") => format!("CAST({q} AS CHAR CHARACTER SET utf8mb4) AS {q}"),
                Some(t) => format!("CAST({q} AS {t}) AS {q}"),
                None => q,
            }
        },
    )?;
    Ok(if high_priority {
        select.replacen("SELECT ", "SELECT HIGH_PRIORITY ", 1)
    } else {
        select
    })
}

impl Decoder for RowDecoder {
    fn rows(&self) -> usize {
        RowDecoder::rows(self)
    }
    fn buffered_bytes(&self) -> usize {
        RowDecoder::buffered_bytes(self)
    }
    fn finish_batch(&mut self) -> Result<arrow_array::RecordBatch> {
        RowDecoder::finish_batch(self)
    }
    fn recycle(&mut self, batch: arrow_array::RecordBatch) {
        RowDecoder::recycle(self, batch)
    }
}

/// Pull rows from `result` into `dec`, sending a batch whenever the byte budget is reached.
async fn drain<P: mysql_async::prelude::Protocol + Unpin>(
    mut result: QueryResult<'_, 'static, P>,
    dec: &mut RowDecoder,
    ds: &Dataset,
    out: &BatchSender,
    what: &str,
    target: &str,
) -> Result<ReadStats> {
    let mut batches = ReadLoop::new(out, what);
    let stream = result
        .stream::<Row>()
        .await
        .map_err(|e| classify(e, Phase::Read, target).context(what))?;
    if let Some(mut stream) = stream {
        while let Some(row) = stream.next().await {
            let row = row.map_err(|e| classify(e, Phase::Read, target).context(what))?;
            match dec.append(row.unwrap_raw()) {
                Ok(n) => batches.received(n as u64),
                Err(e) => {
                    let col = dec.failed_column().and_then(|i| ds.columns.get(i));
                    return Err(value_error(what, col, batches.row_number(&*dec), &e.0));
                }
            }
            batches.step(dec).await?;
        }
    }
    batches.finish(dec).await
}

#[async_trait]
impl ChunkReader for MyReader {
    async fn read(&mut self, ds: &Dataset, chunk: &Chunk, out: &BatchSender) -> Result<ReadStats> {
        let high = self.setup.high_priority && self.setup.non_transactional.contains(&ds.name);
        let sql = select_sql(ds, chunk, high)?;
        let what = format!("{} part {}", ds.name, chunk.ordinal);
        tracing::debug!(target: "sluice::read", "{what}: {}", sluice_core::clause::for_log(&sql));
        let mut dec = RowDecoder::new(ds.arrow_schema(), &ds.columns, self.setup.zero_dates)
            .map_err(|e| Error::internal(format!("{what}: {}", e.0)))?;
        // The statement takes a metadata lock on the table it reads: for the statement alone in
        // chunk consistency, for the rest of the transaction in a snapshot.
        let table = chunk.relation.clone().or_else(|| ds.object.clone());
        let newly = table.filter(|t| self.setup.snapshot || !self.held.contains(t));
        if let Some(t) = &newly
            && self.held.insert(t.clone())
        {
            self.setup.sessions.locks(|b| b.hold(t));
        }
        let stats = self.stream(ds, &sql, &mut dec, out, &what).await;
        if !self.setup.snapshot
            && let Some(t) = newly
            && self.held.remove(&t)
        {
            self.setup.sessions.locks(|b| b.release(&t));
        }
        let stats = stats?;
        self.setup.findings.add(&ds.name, dec.adjustments());
        tracing::trace!("{what}: {} rows from {}", stats.rows, self.setup.target);
        Ok(stats)
    }

    fn session_id(&self) -> Option<u64> {
        Some(self.conn.id() as u64)
    }
}
