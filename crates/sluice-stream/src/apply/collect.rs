//! The applier's side of the change sink: source transactions become units of work.
//!
//! Changes go into each table's Arrow builders as the source decodes them (as for change
//! files). At a transaction's commit the open unit is closed when it holds enough
//! transactions or bytes, or is exclusive; the pump also closes it whenever the source has
//! nothing more to hand over right now, so grouping never delays a quiet stream. Closing
//! builds one batch per table and the unit's writeset.
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

use super::writeset::TableKeySpecs;
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
    /// The next piece.
    Piece(Piece),
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
}

/// A closed unit with what the schedule needs.
pub(crate) struct Ready {
    pub work: Arc<Work>,
    pub keys: Vec<u64>,
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

/// Whether a transaction with these keys would wait for an earlier unit (see
/// [`Collector::set_depends`]).
pub(crate) type Depends = Arc<dyn Fn(&[u64]) -> bool + Send + Sync>;

/// Limits of a unit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Close a unit at this many transactions.
    pub transactions: u64,
    /// Close a unit at this many bytes.
    pub bytes: usize,
    /// Stream a transaction once it holds this many bytes.
    pub stream_bytes: usize,
}

#[derive(Default)]
struct Open {
    pieces: Vec<Piece>,
    order: Vec<(usize, u32)>,
    touched: Vec<usize>,
    keys: Vec<u64>,
    exclusive: bool,
    transactions: u64,
    changes: u64,
    bytes: usize,
    end: Option<AppliedPosition>,
    /// When its first transaction committed.
    since: Option<std::time::Instant>,
    /// Whether its transactions wait for an earlier unit (all of them do, or none).
    depends: Option<bool>,
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
    depends: Option<Depends>,
    /// Row changes of the open transaction.
    tx_rows: u64,
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
            depends: None,
            tx_rows: 0,
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

    /// Turn the rows gathered since the last piece into a piece of the open unit.
    fn close_rows(&mut self) -> Result<()> {
        if self.open.order.is_empty() {
            return Ok(());
        }
        let mut index: HashMap<usize, u32> = HashMap::new();
        let mut tables = Vec::new();
        for &h in &self.open.touched {
            let t = &mut self.tables[h];
            let Some(rows) = t.rows.as_mut() else {
                continue;
            };
            self.open.bytes += rows.bytes();
            let batch = rows.finish()?;
            insert_with_absent(&t.table, &batch, t.columns.len())?;
            let arrays: Vec<ArrayRef> = batch.columns()[..t.columns.len()].to_vec();
            for r in 0..batch.num_rows() {
                t.specs.hashes(&arrays, r, &mut self.open.keys);
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
        let order = self
            .open
            .order
            .drain(..)
            .filter_map(|(h, r)| index.get(&h).map(|i| (*i, r)))
            .collect();
        self.open.touched.clear();
        self.open
            .pieces
            .push(Piece::Rows(ApplyUnit { tables, order }));
        Ok(())
    }

    /// At a transaction's commit: when it would wait for an earlier unit and the open group
    /// would not (or the reverse), close the group before it and start a new one with it.
    fn split_by_dependency(&mut self) -> Result<()> {
        let Some(depends) = self.depends.clone() else {
            return Ok(());
        };
        if self.open.exclusive {
            return Ok(());
        }
        let (keys, bytes, pieces) = (
            self.open.keys.len(),
            self.open.bytes,
            self.open.pieces.len(),
        );
        self.close_rows()?;
        if self.open.pieces.len() != pieces + 1 {
            return Ok(());
        }
        let dep = depends(&self.open.keys[keys..]);
        match self.open.depends {
            Some(d) if d != dep && self.open.transactions > 0 => {
                let piece = self.open.pieces.pop();
                let tx_keys = self.open.keys.split_off(keys);
                let tx_bytes = self.open.bytes - bytes;
                self.open.bytes = bytes;
                self.open.changes = self.open.changes.saturating_sub(self.tx_rows);
                self.cut()?;
                self.open.pieces.extend(piece);
                self.open.keys = tx_keys;
                self.open.bytes = tx_bytes;
                self.open.changes = self.tx_rows;
                self.open.depends = Some(dep);
            }
            _ => self.open.depends = Some(dep),
        }
        Ok(())
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
        let mut keys = open.keys;
        keys.sort_unstable();
        keys.dedup();
        self.ready.push(Ready {
            work: Arc::new(Work {
                pieces: open.pieces,
                more: None,
                commit_ts: end.commit_ts,
                position: Some(end),
                bytes: open.bytes,
                transactions: open.transactions,
                changes: open.changes,
            }),
            keys,
            exclusive: open.exclusive,
        });
        Ok(())
    }

    /// Group by dependency: a transaction that would wait for an earlier unit (a hot row) is
    /// not grouped with ones that would not, so grouping never makes independent
    /// transactions wait behind a hot one, and the dependent ones share commits.
    pub fn set_depends(&mut self, depends: Depends) {
        self.depends = Some(depends);
    }

    /// Close the open unit when the source has nothing more right now (`idle`) or its first
    /// transaction waited `max_age`: grouping amortises the target's commits while a backlog
    /// drains, and never delays a quiet stream by more than `max_age`.
    pub fn cut_due(&mut self, idle: bool, max_age: std::time::Duration) -> Result<()> {
        if idle || self.open.since.is_some_and(|t| t.elapsed() >= max_age) {
            self.cut()?;
        }
        Ok(())
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
            }),
            keys: Vec::new(),
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
            Some(tx) => send(tx, More::Piece(piece)),
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
            }),
            keys: Vec::new(),
            exclusive: true,
        });
        self.streaming = Some(tx);
        Ok(())
    }

    fn stream_rows(&mut self) -> Result<()> {
        self.close_rows()?;
        let pieces = std::mem::take(&mut self.open.pieces);
        self.open.bytes = 0;
        if let Some(tx) = &self.streaming {
            for p in pieces {
                send(tx, More::Piece(p))?;
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
    tokio::task::block_in_place(|| tx.blocking_send(m)).map_err(|_| {
        Error::destination(
            sluice_core::Retry::Transient,
            "the apply worker of a large transaction stopped",
        )
    })
}

impl ChangeSink for Collector {
    fn begin(&mut self, tx: TxMeta) -> Result<()> {
        self.tx = tx;
        self.tx_rows = 0;
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
        self.tx_rows += 1;
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
        self.split_by_dependency()?;
        self.open.transactions += 1;
        self.open.end = Some(end);
        self.open.since.get_or_insert_with(std::time::Instant::now);
        if self.open.exclusive
            || self.open.transactions >= self.limits.transactions
            || self.open.bytes >= self.limits.bytes
        {
            self.cut()?;
        }
        Ok(())
    }
}
