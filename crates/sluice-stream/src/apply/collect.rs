//! The applier's side of the change sink: source transactions become units of work.
//!
//! Changes go into each table's Arrow builders as the source decodes them (as for change
//! files). Grouping follows back-pressure: at a transaction's commit the open unit is closed
//! when a worker could start it now (fewer units waiting or running than workers) and its
//! first transaction has waited [`Limits::linger`], or when it reaches its byte or transaction
//! cap, or is exclusive; the pump also closes it once it has lingered, or when the source has
//! nothing more to hand over. So a caught-up stream applies a transaction within the linger
//! time, and a backlog grows units to what the source delivers while the workers are busy: the
//! target's commits, which are made one after another in source order, are amortised over as
//! many transactions as waiting would have cost anyway; and a source slower than the workers
//! (they idle) still gets units of a linger's worth of transactions rather than one each,
//! which would spend the target's commits for nothing. Closing builds one batch per table and
//! each row's keys (its writeset) in application order.
//!
//! Barriers: a table whose columns change (a `Relation` or table map with other columns), a
//! truncate, or a change to a table without a key makes the unit exclusive; the barrier is a
//! piece of the unit at its place in source order, so on PostgreSQL it commits atomically with
//! the transaction around it.
//!
//! A transaction larger than the streaming threshold is not held: the unit is handed over
//! (exclusive) as soon as it passes the threshold and its further pieces follow through a
//! small channel, so memory stays bounded whatever the transaction's size; the target keeps
//! one transaction open for it.
//!
//! Length: about 600 lines; the sink's callbacks, closing a unit, barriers and the streaming of a
//! large transaction all read and change the one open unit, so they stay together.

use super::writeset::{RowKeys, TableKeySpecs};
use crate::state::in_table_snapshot;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use sluice_core::apply::{AppliedPosition, ApplyUnit, Barrier, TableKeys, UnitTable};
use sluice_core::change::{ChangeOp, ChangeRows, ChangeSink, TxMeta, change_schema};
use sluice_core::table::{ColumnDesc, TableRef};
use sluice_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// A part of a unit, in source order.
#[derive(Debug, Clone)]
pub(crate) enum Piece {
    /// Row changes.
    Rows(ApplyUnit),
    /// A statement applied alone.
    Barrier(Barrier),
}

/// What follows a streamed unit's first pieces.
#[derive(Debug)]
pub(crate) enum More {
    /// The next piece, with the keys of its rows (none for a barrier).
    Piece(Piece, RowKeys),
    /// The transaction committed at this position.
    End(AppliedPosition),
}

/// One unit of work: source transactions applied in one target transaction.
#[derive(Debug)]
pub(crate) struct Work {
    /// Pieces in source order.
    pub pieces: Vec<Piece>,
    /// For a streamed transaction: the rest of it. Taken by the one worker that applies it.
    pub more: Option<Mutex<Option<mpsc::Receiver<More>>>>,
    /// Where the unit ends (`unit` is set when it is applied); `None` for a streamed one.
    pub position: Option<AppliedPosition>,
    /// Arrow bytes held.
    pub bytes: usize,
    /// Source transactions in the unit.
    pub transactions: u64,
    /// Row changes in the unit.
    pub changes: u64,
    /// Commit time of the unit's last transaction, µs.
    pub commit_ts: Option<i64>,
    /// The keys of each row, rows in application order.
    pub rows: RowKeys,
}

/// A closed unit with what the schedule needs.
pub(crate) struct Ready {
    pub work: Arc<Work>,
    pub exclusive: bool,
}

struct Table {
    table: TableRef,
    /// Its name on the target.
    target: TableRef,
    ignored: bool,
    snapshot_position: Option<String>,
    columns: Arc<Vec<ColumnDesc>>,
    key: Arc<Vec<String>>,
    specs: TableKeySpecs,
    rows: Option<ChangeRows>,
}

/// Whether every worker has a unit to run (units handed over and not yet committed, at least
/// as many as workers): see [`Collector::set_busy`].
pub(crate) type Busy = Arc<dyn Fn(usize) -> bool + Send + Sync>;

/// Limits of a unit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Close a unit at this many transactions at most.
    pub transactions: u64,
    /// Close a unit at this many bytes at most.
    pub bytes: usize,
    /// Stream a transaction once it holds this many bytes.
    pub stream_bytes: usize,
    /// How long a unit's first transaction may wait for others to join it while a worker is
    /// free.
    pub linger: std::time::Duration,
}

#[derive(Default)]
struct Open {
    pieces: Vec<Piece>,
    order: Vec<(usize, u32)>,
    touched: Vec<usize>,
    rows: RowKeys,
    exclusive: bool,
    transactions: u64,
    changes: u64,
    bytes: usize,
    end: Option<AppliedPosition>,
    /// When its first transaction committed.
    since: Option<std::time::Instant>,
}

/// The change sink of `sluice replicate`.
pub(crate) struct Collector {
    tables: Vec<Table>,
    by_ref: HashMap<TableRef, usize>,
    keys: HashMap<TableRef, TableKeys>,
    tx: TxMeta,
    in_tx: bool,
    cur: Option<(usize, ChangeOp)>,
    seq: u64,
    open: Open,
    streaming: Option<mpsc::Sender<More>>,
    limits: Limits,
    source_engine: &'static str,
    busy: Option<Busy>,
    /// Per table, scratch for the keys of its rows while a piece is built.
    scratch: Vec<(Vec<u64>, Vec<u32>)>,
    /// Units closed since the pump last took them.
    pub ready: Vec<Ready>,
    /// The restart position of the last transaction seen.
    pub restart: Option<String>,
    /// Source transactions received (whole).
    pub received: u64,
}

/// One captured table as the collector starts with it.
pub(crate) struct Captured {
    pub table: TableRef,
    pub target: TableRef,
    pub columns: Vec<ColumnDesc>,
    pub snapshot_position: Option<String>,
}

fn key_of(columns: &[ColumnDesc], keys: Option<&TableKeys>) -> Vec<String> {
    let pk = keys.map(|k| k.primary.clone()).unwrap_or_default();
    if pk.iter().all(|c| columns.iter().any(|d| &d.name == c)) {
        pk
    } else {
        Vec::new()
    }
}

fn same_columns(a: &[ColumnDesc], b: &[ColumnDesc]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.field.data_type() == y.field.data_type()
                && x.source_type == y.source_type
        })
}

impl Collector {
    /// A collector for `captured` tables with their `keys`.
    pub fn new(
        captured: Vec<Captured>,
        keys: Vec<TableKeys>,
        limits: Limits,
        source_engine: &'static str,
    ) -> Self {
        let keys: HashMap<TableRef, TableKeys> =
            keys.into_iter().map(|k| (k.table.clone(), k)).collect();
        let mut c = Collector {
            tables: Vec::new(),
            by_ref: HashMap::new(),
            keys,
            tx: TxMeta {
                pos: String::new(),
                xid: String::new(),
                commit_ts: None,
            },
            in_tx: false,
            cur: None,
            seq: 0,
            open: Open::default(),
            streaming: None,
            limits,
            source_engine,
            busy: None,
            scratch: Vec::new(),
            ready: Vec::new(),
            restart: None,
            received: 0,
        };
        for t in captured {
            let k = c.keys.get(&t.table);
            let table = Table {
                specs: TableKeySpecs::new(&t.table, &t.columns, k),
                key: Arc::new(key_of(&t.columns, k)),
                columns: Arc::new(t.columns),
                table: t.table.clone(),
                target: t.target,
                ignored: false,
                snapshot_position: t.snapshot_position,
                rows: None,
            };
            c.by_ref.insert(t.table, c.tables.len());
            c.tables.push(table);
        }
        c
    }

    /// Stop handing pieces to a streamed transaction's worker (the run is stopping): it rolls
    /// the transaction back.
    pub fn abandon(&mut self) {
        self.streaming = None;
        self.open = Open::default();
        self.in_tx = false;
    }

    /// True inside a source transaction.
    pub fn in_tx(&self) -> bool {
        self.in_tx
    }

    fn rows_for(&mut self, h: usize) -> Result<&mut ChangeRows> {
        let t = &mut self.tables[h];
        if t.rows.is_none() {
            let schema = change_schema(&t.table, &t.columns)?;
            t.rows = Some(ChangeRows::new(schema, t.columns.len())?);
        }
        t.rows
            .as_mut()
            .ok_or_else(|| Error::internal("a table without builders"))
    }

    /// Turn the rows gathered since the last piece into a piece of the open unit, with each
    /// row's keys appended in application order.
    fn close_rows(&mut self) -> Result<()> {
        if self.open.order.is_empty() {
            return Ok(());
        }
        let mut index: HashMap<usize, u32> = HashMap::new();
        let mut tables = Vec::new();
        if self.scratch.len() < self.tables.len() {
            self.scratch
                .resize_with(self.tables.len(), Default::default);
        }
        for &h in &self.open.touched {
            let t = &mut self.tables[h];
            let Some(rows) = t.rows.as_mut() else {
                continue;
            };
            self.open.bytes += rows.bytes();
            let batch = rows.finish()?;
            insert_with_absent(&t.table, &batch, t.columns.len())?;
            let arrays: Vec<ArrayRef> = batch.columns()[..t.columns.len()].to_vec();
            let (keys, ends) = &mut self.scratch[h];
            keys.clear();
            ends.clear();
            for r in 0..batch.num_rows() {
                t.specs.hashes(&arrays, r, keys);
                ends.push(keys.len() as u32);
            }
            index.insert(h, tables.len() as u32);
            tables.push(UnitTable {
                table: t.target.clone(),
                columns: t.columns.clone(),
                key: t.key.clone(),
                batch,
                source_engine: self.source_engine,
            });
        }
        let mut order = Vec::with_capacity(self.open.order.len());
        let before = self.open.rows.keys.len();
        for (h, r) in self.open.order.drain(..) {
            let Some(i) = index.get(&h) else {
                continue;
            };
            let (keys, ends) = &self.scratch[h];
            let r = r as usize;
            let start = if r == 0 { 0 } else { ends[r - 1] as usize };
            self.open
                .rows
                .keys
                .extend_from_slice(&keys[start..ends[r] as usize]);
            self.open.rows.ends.push(self.open.rows.keys.len() as u32);
            order.push((*i, r as u32));
        }
        self.open.bytes += (self.open.rows.keys.len() - before) * 8;
        self.open.touched.clear();
        self.open.pieces.push(Piece::Rows(ApplyUnit {
            tables,
            order,
            batches: Vec::new(),
        }));
        Ok(())
    }

    /// Bytes in the tables' builders not yet closed into a piece.
    fn touched_bytes(&mut self) -> usize {
        let mut n = 0;
        for &h in &self.open.touched {
            if let Some(r) = self.tables[h].rows.as_mut() {
                n += r.bytes();
            }
        }
        n
    }

    /// Close the open unit (between transactions).
    pub fn cut(&mut self) -> Result<()> {
        if self.in_tx || self.streaming.is_some() {
            return Ok(());
        }
        self.close_rows()?;
        let open = std::mem::take(&mut self.open);
        let Some(end) = open.end else {
            return Ok(());
        };
        self.ready.push(Ready {
            work: Arc::new(Work {
                pieces: open.pieces,
                more: None,
                commit_ts: end.commit_ts,
                position: Some(end),
                bytes: open.bytes,
                transactions: open.transactions,
                changes: open.changes,
                rows: open.rows,
            }),
            exclusive: open.exclusive,
        });
        Ok(())
    }

    /// Group by back-pressure: `busy` says whether every worker already has a unit (see the
    /// module documentation).
    pub fn set_busy(&mut self, busy: Busy) {
        self.busy = Some(busy);
    }

    /// Close the open unit when the source handed nothing over while the pump waited (`idle`;
    /// the wait ends when the unit is due, see [`Collector::due_in`]), or when it has lingered
    /// and a worker is free.
    pub fn cut_due(&mut self, idle: bool) -> Result<()> {
        if idle || self.lingered_with_a_worker_free() {
            self.cut()?;
        }
        Ok(())
    }

    /// How long the pump may wait for the source before the open unit is due (`None`: no unit
    /// is open).
    pub fn due_in(&self) -> Option<std::time::Duration> {
        self.open
            .since
            .map(|t| self.limits.linger.saturating_sub(t.elapsed()))
    }

    /// The open unit's first transaction has waited its linger time and a worker could start
    /// the unit now.
    fn lingered_with_a_worker_free(&self) -> bool {
        let lingered = self
            .open
            .since
            .is_some_and(|t| t.elapsed() >= self.limits.linger);
        lingered && !self.busy.as_ref().is_some_and(|b| b(self.ready.len()))
    }

    /// Between transactions with nothing open: a unit that only moves the applied position to
    /// `received` (the source sent nothing for our tables up to there), so a quiet stream
    /// lets the source release its log.
    pub fn advance_to(&mut self, received: &str) {
        let moved = self.restart.as_deref().is_none_or(|r| received > r);
        if self.in_tx || self.streaming.is_some() || self.open.end.is_some() || !moved {
            return;
        }
        self.restart = Some(received.to_string());
        self.ready.push(Ready {
            work: Arc::new(Work {
                pieces: Vec::new(),
                more: None,
                position: Some(AppliedPosition {
                    unit: 0,
                    restart: received.to_string(),
                    pos: received.to_string(),
                    commit_ts: None,
                }),
                bytes: 0,
                transactions: 0,
                changes: 0,
                commit_ts: None,
                rows: RowKeys::default(),
            }),
            exclusive: false,
        });
    }

    fn barrier(&mut self, b: Barrier) -> Result<()> {
        self.close_rows()?;
        self.open.exclusive = true;
        self.send_or_keep(Piece::Barrier(b))
    }

    /// A piece of a streamed transaction goes to its worker; otherwise it stays in the unit.
    fn send_or_keep(&mut self, piece: Piece) -> Result<()> {
        match &self.streaming {
            Some(tx) => send(tx, More::Piece(piece, RowKeys::default())),
            None => {
                self.open.pieces.push(piece);
                Ok(())
            }
        }
    }

    /// The open transaction passed the threshold: hand the unit over now, stream the rest.
    fn start_streaming(&mut self) -> Result<()> {
        self.close_rows()?;
        let open = std::mem::take(&mut self.open);
        let (tx, rx) = mpsc::channel(2);
        self.ready.push(Ready {
            work: Arc::new(Work {
                pieces: open.pieces,
                more: Some(Mutex::new(Some(rx))),
                position: None,
                bytes: open.bytes,
                transactions: open.transactions + 1,
                changes: open.changes,
                commit_ts: self.tx.commit_ts,
                rows: open.rows,
            }),
            exclusive: true,
        });
        self.streaming = Some(tx);
        Ok(())
    }

    fn stream_rows(&mut self) -> Result<()> {
        self.close_rows()?;
        let pieces = std::mem::take(&mut self.open.pieces);
        let mut keys = std::mem::take(&mut self.open.rows);
        self.open.bytes = 0;
        if let Some(tx) = &self.streaming {
            for p in pieces {
                let k = match &p {
                    Piece::Rows(u) => keys.take_front(u.order.len()),
                    Piece::Barrier(_) => RowKeys::default(),
                };
                send(tx, More::Piece(p, k))?;
            }
        }
        Ok(())
    }
}

/// An insert that does not carry every column cannot be applied: there is no earlier value to
/// keep (a key update of a row whose large value was unchanged, under PostgreSQL's default
/// replica identity).
fn insert_with_absent(table: &TableRef, batch: &RecordBatch, columns: usize) -> Result<()> {
    let (op, absent) = (batch.column(columns), batch.column(columns + 5));
    let (op, absent) = (op.as_string::<i32>(), absent.as_list::<i32>());
    for r in 0..batch.num_rows() {
        if op.value(r) == ChangeOp::Insert.as_str() && !absent.value(r).is_empty() {
            return Err(Error::data(format!(
                "{table}: the source sent a new row without the unchanged value of a column \
                 (its key changed and the value is stored out of line), so it cannot be \
                 inserted on the target. Set REPLICA IDENTITY FULL on the source table and \
                 start the replication over."
            )));
        }
    }
    Ok(())
}

/// Hand a piece to the worker applying a streamed transaction, waiting while it is busy (the
/// source is read on this thread, so the wait is what bounds memory).
fn send(tx: &mpsc::Sender<More>, m: More) -> Result<()> {
    tokio::task::block_in_place(|| tx.blocking_send(m).map_err(|_| ())).map_err(|()| {
        Error::destination(
            sluice_core::Retry::Transient,
            "the apply worker of a large transaction stopped",
        )
    })
}

impl ChangeSink for Collector {
    fn begin(&mut self, tx: TxMeta) -> Result<()> {
        self.tx = tx;
        self.in_tx = true;
        Ok(())
    }

    fn relation(&mut self, table: &TableRef, columns: &[ColumnDesc]) -> Result<usize> {
        let Some(&h) = self.by_ref.get(table) else {
            self.by_ref.insert(table.clone(), self.tables.len());
            self.tables.push(Table {
                table: table.clone(),
                target: table.clone(),
                ignored: true,
                snapshot_position: None,
                columns: Arc::new(Vec::new()),
                key: Arc::new(Vec::new()),
                specs: TableKeySpecs::default(),
                rows: None,
            });
            return Ok(self.tables.len() - 1);
        };
        if self.tables[h].ignored || same_columns(&self.tables[h].columns, columns) {
            return Ok(h);
        }
        self.barrier(Barrier::Columns {
            table: self.tables[h].target.clone(),
            columns: columns.to_vec(),
            source_engine: self.source_engine,
        })?;
        let k = self.keys.get(table);
        let t = &mut self.tables[h];
        t.specs = TableKeySpecs::new(table, columns, k);
        t.key = Arc::new(key_of(columns, k));
        t.columns = Arc::new(columns.to_vec());
        t.rows = None;
        Ok(h)
    }

    fn row(&mut self, table: usize, op: ChangeOp) -> Result<Option<&mut ChangeRows>> {
        self.cur = None;
        let t = &self.tables[table];
        if t.ignored || in_table_snapshot(t.snapshot_position.as_deref(), &self.tx.pos) {
            return Ok(None);
        }
        if op == ChangeOp::Truncate {
            let name = t.target.clone();
            self.barrier(Barrier::Truncate(vec![name]))?;
            return Ok(None);
        }
        self.cur = Some((table, op));
        self.rows_for(table).map(Some)
    }

    fn row_done(&mut self) -> Result<()> {
        let Some((h, op)) = self.cur.take() else {
            return Ok(());
        };
        self.seq += 1;
        let (seq, tx) = (self.seq, self.tx.clone());
        let rows = self.rows_for(h)?;
        let row = rows.rows() as u32;
        rows.finish_row(op, &tx, seq)?;
        let pending = rows.bytes();
        if !self.open.touched.contains(&h) {
            self.open.touched.push(h);
        }
        self.open.order.push((h, row));
        self.open.changes += 1;
        if self.tables[h].key.is_empty() {
            self.open.exclusive = true;
        }
        if self.open.bytes + pending >= self.limits.stream_bytes {
            if self.streaming.is_none() {
                self.start_streaming()?;
            } else {
                self.stream_rows()?;
            }
        }
        Ok(())
    }

    fn commit(&mut self, restart: &str) -> Result<()> {
        self.in_tx = false;
        self.received += 1;
        self.restart = Some(restart.to_string());
        let end = AppliedPosition {
            unit: 0,
            restart: restart.to_string(),
            pos: self.tx.pos.clone(),
            commit_ts: self.tx.commit_ts,
        };
        if self.streaming.is_some() {
            self.stream_rows()?;
            if let Some(tx) = self.streaming.take() {
                send(&tx, More::End(end))?;
            }
            self.open = Open::default();
            return Ok(());
        }
        self.open.transactions += 1;
        self.open.end = Some(end);
        self.open.since.get_or_insert_with(std::time::Instant::now);
        let pending = self.open.bytes + self.touched_bytes();
        if self.open.exclusive
            || self.open.transactions >= self.limits.transactions
            || pending >= self.limits.bytes
            || self.lingered_with_a_worker_free()
        {
            self.cut()?;
        }
        Ok(())
    }
}
