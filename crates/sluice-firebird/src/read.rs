//! Streaming one chunk: a SELECT over the chunk's pointer pages (or key range), rows decoded
//! into Arrow batches cut by bytes.
//!
//! A reader is one worker attachment on a thread of its own (see `connect.rs`). In snapshot
//! consistency it reads inside a READ ONLY SNAPSHOT transaction that joined the coordinator's
//! snapshot by number (`SET TRANSACTION … SNAPSHOT AT NUMBER n`) and was checked to see
//! exactly that snapshot (`snapshot.rs` explains why a join must be checked), for the whole
//! run; after each chunk it also checks that the coordinator's transaction, which keeps the
//! snapshot's record versions from garbage collection, was alive throughout the read. In
//! chunk consistency each chunk starts and commits its own snapshot transaction.
//!
//! Memory: the session thread fills one batch, hands it over and waits until the writer has
//! taken it (the writer then hands back the previous batch's memory) before it fills the next,
//! so a worker holds about two batches, as with every other source.

use crate::connect::{FbConn, FbTarget, Session, TransactionInfo, as_i64};
use crate::decode::RowDecoder;
use crate::error::{Phase, classify};
use crate::snapshot::SharedSnapshot;
use crate::sql::{FbDialect, quote_ident};
use crate::types::select_expr;
use arrow_array::RecordBatch;
use async_trait::async_trait;
use rsfbclient_core::SqlType;
use sluice_core::batch::value_error;
use sluice_core::clause;
use sluice_core::{
    BatchSender, Batching, Chunk, ChunkReader, ColumnDesc, Cut, Dataset, Decoder, Error, ReadStats,
    Result,
};

/// The transaction a chunk-consistency read runs in.
const CHUNK_TRANSACTION: &str = "SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT";

/// The statement that joins snapshot `number`.
pub fn join_snapshot_sql(number: u64) -> String {
    format!("SET TRANSACTION READ ONLY ISOLATION LEVEL SNAPSHOT AT NUMBER {number}")
}

/// Counts the transactions numbered in `[LO, HI)` that committed after snapshot `SNAP`
/// (`RDB$GET_TRANSACTION_CN` is their commit number; active, dead and limbo transactions have
/// 0 or a negative number) and names the first.
const LATE_COMMITS_SQL: &str = "EXECUTE BLOCK (LO BIGINT = ?, HI BIGINT = ?, SNAP BIGINT = ?)
RETURNS (LATE BIGINT, FIRST_LATE BIGINT)
AS
DECLARE T BIGINT;
BEGIN
  LATE = 0;
  T = LO;
  WHILE (T < HI) DO
  BEGIN
    IF (RDB$GET_TRANSACTION_CN(T) > SNAP) THEN
    BEGIN
      LATE = LATE + 1;
      IF (FIRST_LATE IS NULL) THEN FIRST_LATE = T;
    END
    T = T + 1;
  END
  SUSPEND;
END";

/// The commit number of one transaction: 0 while it is active.
const COMMIT_NUMBER_SQL: &str =
    "SELECT RDB$GET_TRANSACTION_CN(CAST(? AS BIGINT)) FROM RDB$DATABASE";

/// How a worker's join of the shared snapshot turned out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinCheck {
    /// The worker sees exactly the snapshot.
    Exact,
    /// The worker would see `count` transactions that committed after the snapshot, the first
    /// being `first`: they are numbered below its oldest interesting transaction `oldest`.
    Late {
        /// The first such transaction.
        first: u64,
        /// How many there are.
        count: u64,
        /// The worker's oldest interesting transaction.
        oldest: u64,
    },
}

/// One worker session.
pub struct FbReader {
    session: Session,
    /// Snapshot consistency: reads only once it joined (and was checked against) this snapshot.
    shared: bool,
    /// The snapshot joined, once checked exact.
    joined: Option<SharedSnapshot>,
}

impl FbReader {
    /// Attach a worker session. In snapshot consistency (`shared`) it must then
    /// [`join`](FbReader::join) the snapshot and pass [`check`](FbReader::check) before it
    /// reads; in chunk consistency it is ready.
    pub async fn attach(target: &FbTarget, tag: &str, shared: bool) -> Result<Self> {
        Ok(FbReader {
            session: target.open(tag).await?,
            shared,
            joined: None,
        })
    }

    /// Start the session's transaction in `snapshot` (ending any it had).
    pub async fn join(&mut self, snapshot: SharedSnapshot) -> Result<()> {
        self.joined = None;
        sluice_core::failpoint::hit("firebird.before_join")?;
        let n = snapshot.number;
        let display = self.session.display().to_string();
        self.session
            .call(move |c| c.begin(&join_snapshot_sql(n)))
            .await?
            .map_err(|e| {
                classify(e, Phase::Snapshot, &display)
                    .context(format!("joining snapshot number {n}"))
            })
    }

    /// Check what the joined transaction sees: its snapshot number must be `snapshot`'s (an
    /// error otherwise), and no transaction below its oldest interesting transaction may have
    /// committed after the snapshot (see `snapshot.rs`). An exact join makes the reader ready.
    pub async fn check(&mut self, snapshot: SharedSnapshot) -> Result<JoinCheck> {
        let display = self.session.display().to_string();
        let check = self
            .session
            .call(move |c| check_join(c, snapshot))
            .await?
            .map_err(|e| classify(e, Phase::Snapshot, &display))??;
        if check == JoinCheck::Exact {
            self.joined = Some(snapshot);
        }
        Ok(check)
    }

    /// End the session's transaction (before the snapshot is taken again).
    pub async fn leave(&mut self) -> Result<()> {
        self.joined = None;
        let display = self.session.display().to_string();
        self.session
            .call(|c| c.commit())
            .await?
            .map_err(|e| classify(e, Phase::Snapshot, &display))
    }
}

/// On the session thread: see [`FbReader::check`].
fn check_join(
    c: &mut FbConn,
    snapshot: SharedSnapshot,
) -> std::result::Result<Result<JoinCheck>, rsfbclient_core::FbError> {
    let TransactionInfo {
        oldest,
        snapshot_number,
        ..
    } = c.transaction_info()?;
    if snapshot_number != Some(snapshot.number) {
        return Ok(Err(Error::source_permanent(format!(
            "a worker of {} joined snapshot number {} but reads at {:?}: the server did not \
             start the shared snapshot, so the export would not be one point in time. Use \
             --consistency chunk.",
            c.display(),
            snapshot.number,
            snapshot_number
        ))));
    }
    tracing::debug!(
        target: "sluice::snapshot",
        "join check: {snapshot:?}; the session reads at {snapshot_number:?}, its oldest \
         interesting transaction is {oldest}"
    );
    if oldest <= snapshot.oldest {
        return Ok(Ok(JoinCheck::Exact));
    }
    let rows = c.query(
        LATE_COMMITS_SQL,
        vec![
            SqlType::Integer(snapshot.oldest as i64),
            SqlType::Integer(oldest as i64),
            SqlType::Integer(snapshot.number as i64),
        ],
    )?;
    let Some((count, first)) = rows
        .first()
        .and_then(|r| Some((as_i64(r.first()?)?, r.get(1).and_then(as_i64))))
    else {
        return Ok(Err(Error::internal(
            "the check of a snapshot join returned no count",
        )));
    };
    Ok(Ok(if count == 0 {
        JoinCheck::Exact
    } else {
        JoinCheck::Late {
            first: first.unwrap_or(0) as u64,
            count: count as u64,
            oldest,
        }
    }))
}

/// The SELECT that reads `chunk` of `ds`.
pub fn select_sql(ds: &Dataset, chunk: &Chunk) -> Result<String> {
    clause::select_chunk(
        &FbDialect,
        ds,
        chunk.relation.as_ref(),
        &chunk.bounds,
        |c| select_expr(&quote_ident(&c.name), c.cast.as_deref()),
    )
}

impl Decoder for RowDecoder {
    fn rows(&self) -> usize {
        RowDecoder::rows(self)
    }
    fn buffered_bytes(&self) -> usize {
        RowDecoder::buffered_bytes(self)
    }
    fn finish_batch(&mut self) -> Result<RecordBatch> {
        RowDecoder::finish_batch(self)
    }
    fn recycle(&mut self, batch: RecordBatch) {
        RowDecoder::recycle(self, batch)
    }
}

enum Msg {
    Batch(Cut),
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
    guard: Option<SharedSnapshot>,
    what: &str,
    columns: &[ColumnDesc],
    batches: &tokio::sync::mpsc::Sender<Msg>,
    acks: &std::sync::mpsc::Receiver<Option<RecordBatch>>,
) -> Result<ReadStats> {
    let display = conn.display().to_string();
    if own_transaction {
        conn.begin(CHUNK_TRANSACTION)
            .map_err(|e| classify(e, Phase::Snapshot, &display).context(what))?;
    } else if !conn.in_transaction() {
        // Never fall back to a transaction of the connection's own choosing.
        return Err(Error::internal(format!(
            "{what}: the worker's snapshot transaction is not open"
        )));
    }
    let mut dec = RowDecoder::new(schema)?;
    let mut batching = Batching::new(budget);
    let mut failure: Option<Error> = None;
    let hand_over = |dec: &mut RowDecoder, cut: Cut| {
        let stopped = || Error::interrupted(format!("{what}: the writer stopped"));
        batches
            .blocking_send(Msg::Batch(cut))
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
            Ok(n) => batching.received(n as u64),
            Err(e) => {
                let row = batching.row_number(&dec);
                failure = Some(value_error(what, columns.get(e.column), row, &e.message));
                return false;
            }
        }
        match batching.full(&mut dec) {
            Ok(None) => true,
            Ok(Some(cut)) => match hand_over(&mut dec, cut) {
                Ok(()) => true,
                Err(e) => {
                    failure = Some(e);
                    false
                }
            },
            Err(e) => {
                failure = Some(e.context(what));
                false
            }
        }
    });
    if let Some(f) = failure {
        return Err(f);
    }
    fetched.map_err(|e| classify(e, Phase::Read, &display).context(what))?;
    if let Some(snapshot) = guard {
        guard_alive(conn, snapshot, what)?;
    }
    if let Some(cut) = batching.last(&mut dec).map_err(|e| e.context(what))? {
        hand_over(&mut dec, cut)?;
    }
    if own_transaction {
        conn.commit()
            .map_err(|e| classify(e, Phase::Read, &display).context(what))?;
    }
    Ok(batching.stats())
}

/// Check, after a chunk was read, that the coordinator's transaction of `snapshot` is still
/// active: while it is, its lock keeps garbage collection from removing record versions the
/// snapshot needs (a worker's own transaction, started later, would not). It cannot become
/// active again, so alive now means alive during the whole read.
fn guard_alive(conn: &mut FbConn, snapshot: SharedSnapshot, what: &str) -> Result<()> {
    let display = conn.display().to_string();
    let rows = conn
        .query(
            COMMIT_NUMBER_SQL,
            vec![SqlType::Integer(snapshot.coordinator as i64)],
        )
        .map_err(|e| classify(e, Phase::Read, &display).context(what))?;
    match rows.first().and_then(|r| r.first()).and_then(as_i64) {
        Some(0) => Ok(()),
        other => Err(Error::source_permanent(format!(
            "{what}: the coordinator transaction {} that holds snapshot number {} on {display} \
             ended during the read (commit number {other:?}; its attachment was lost), so \
             garbage collection may have removed record versions of the snapshot. Re-run with \
             --resume to read the missing parts under a new snapshot.",
            snapshot.coordinator, snapshot.number
        ))),
    }
}

#[async_trait]
impl ChunkReader for FbReader {
    async fn read(&mut self, ds: &Dataset, chunk: &Chunk, out: &BatchSender) -> Result<ReadStats> {
        let sql = select_sql(ds, chunk)?;
        let what = format!("{} part {}", ds.name, chunk.ordinal);
        tracing::debug!(target: "sluice::read", "{what}: {}", sluice_core::clause::for_log(&sql));
        let (btx, mut brx) = tokio::sync::mpsc::channel::<Msg>(1);
        let (atx, arx) = std::sync::mpsc::channel::<Option<RecordBatch>>();
        let schema = ds.arrow_schema();
        let budget = out.batch_bytes();
        let own = !self.shared;
        let guard = self.joined;
        if self.shared && guard.is_none() {
            return Err(Error::internal(format!(
                "{what}: the worker has not joined the shared snapshot"
            )));
        }
        let columns = ds.columns.clone();
        let job_what = what.clone();
        self.session.submit(move |conn| {
            let r = stream(
                conn, &sql, schema, budget, own, guard, &job_what, &columns, &btx, &arx,
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
                Some(Msg::Batch(cut)) => {
                    // The writer has finished the batch before this one: its memory goes
                    // back to the session thread's decoder.
                    let _ = atx.send(out.deliver(cut, &what).await?);
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
