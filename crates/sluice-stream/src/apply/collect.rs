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
//! Barriers: a table whose columns change (measured against the columns the target follows:
//! the catalog may be ahead of the stream), a truncate, or an update or delete of a table
//! without a key makes the unit exclusive; the barrier is a piece of the unit at its place in
//! source order, so on PostgreSQL it commits atomically with the transaction around it. Each
//! barrier carries the position after the changes before it (the restart point before its
//! transaction and how many of that transaction's changes precede it), which a target whose
//! DDL commits by itself records first; a restart from such a position passes over those
//! changes ([`Collector::resume_at`]).
//!
//! A transaction larger than the streaming threshold is not held (`collect/streamed.rs`); which
//! columns reach the target and what it matches by is `collect/shape.rs`.
//!
//! Length: about 600 lines; the sink's callbacks, closing a unit, barriers and restarts inside
//! a transaction all read and change the one open unit, so they stay together.

use super::writeset::{RowKeys, TableKeySpecs};
use crate::state::in_table_snapshot;
use arrow_array::ArrayRef;
use sluice_core::apply::{
    AppliedPosition, ApplyUnit, Barrier, ColumnChange, Engine, SourceColumn, TableKeys, UnitTable,
};
use sluice_core::change::{ChangeOp, ChangeRows, ChangeSink, TxMeta, change_schema};
use sluice_core::table::{ColumnDesc, TableRef};
use sluice_core::{Error, Result, StreamPos};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

mod shape;
mod streamed;

use shape::{applied_columns, insert_with_absent, key_of, same_columns, sole_key};
pub(crate) use streamed::More;
use streamed::send;

/// A part of a unit, in source order.
#[derive(Debug, Clone)]
pub(crate) enum Piece {
    /// Row changes.
    Rows(ApplyUnit),
    /// A statement applied alone, with the position once every change before it is applied
    /// (`unit` 0: the worker sets it), which a target whose DDL commits by itself records
    /// first (see `ApplySession::barrier`).
    Barrier(Barrier, AppliedPosition),
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
    /// Sent by the source without being captured: its first change is reported (see the
    /// change sink's `Table::unknown` for why not its description).
    unknown: bool,
    snapshot_position: Option<StreamPos>,
    /// The source columns the target table follows: what a column change is measured from.
    known: Vec<SourceColumn>,
    /// The columns rows are built with (the last relation's, else the catalog's).
    columns: Arc<Vec<ColumnDesc>>,
    /// The columns applied to the target: `columns` without generated ones, which the target
    /// computes (a MySQL/MariaDB source logs their values; PostgreSQL does not send them).
    applied: Arc<Vec<ColumnDesc>>,
    /// When `applied` leaves columns out: the batch columns kept (the applied ones, then the
    /// change columns).
    keep: Option<Vec<usize>>,
    key: Arc<Vec<String>>,
    /// See `UnitTable::sole_key`.
    sole_key: bool,
    specs: TableKeySpecs,
    rows: Option<ChangeRows>,
}

/// Whether every worker has a unit to run (units handed over and not yet committed, at least
/// as many as workers): see [`Collector::set_busy`].
pub(crate) type Busy = Arc<dyn Fn(usize) -> bool + Send + Sync>;

/// Hands closed units to the workers at once (see [`Collector::set_handoff`]).
pub(crate) type Handoff = Arc<dyn Fn(Vec<Ready>) + Send + Sync>;

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
    /// The foreign keys the target holds, `(child, name)`: only they order rows through the
    /// writesets (see [`Collector::set_target_foreign_keys`]); `None`: every one.
    target_fks: Option<Vec<(TableRef, String)>>,
    tx: TxMeta,
    in_tx: bool,
    cur: Option<(usize, ChangeOp)>,
    seq: u64,
    open: Open,
    streaming: Option<mpsc::Sender<More>>,
    /// Row changes of the streamed transaction sent after its unit was handed over.
    streamed_changes: u64,
    limits: Limits,
    source_engine: Engine,
    busy: Option<Busy>,
    handoff: Option<Handoff>,
    /// Per table, scratch for the keys of its rows while a piece is built.
    scratch: Vec<(Vec<u64>, Vec<u32>)>,
    /// Row changes of the open transaction handed to the sink so far (every `row` call,
    /// kept or not): where a barrier stands inside its transaction.
    tx_rows: u64,
    /// `_pos` of the last committed transaction.
    last_pos: StreamPos,
    /// A restart from inside a transaction: its `_pos` and how many of its changes are
    /// already applied (see `AppliedPosition::skip`).
    skip: Option<(StreamPos, u64)>,
    /// Changes of the current transaction still to pass over.
    skipping: u64,
    /// Units closed since the pump last took them.
    pub ready: Vec<Ready>,
    /// The restart position of the last transaction seen.
    pub restart: Option<StreamPos>,
    /// Source transactions received (whole).
    pub received: u64,
    /// Changes of tables the run does not capture (a captured table renamed), left out.
    pub ignored: u64,
}

/// One captured table as the collector starts with it.
pub(crate) struct Captured {
    pub table: TableRef,
    pub target: TableRef,
    /// The source's columns now (the catalog's, less generated columns).
    pub columns: Vec<ColumnDesc>,
    /// The source columns the target follows, when it recorded them: the catalog may be
    /// ahead of the stream, and a column change measured from it would be missed.
    pub known: Option<Vec<SourceColumn>>,
    pub snapshot_position: Option<StreamPos>,
}

impl Collector {
    /// Order rows through the foreign keys `fks` (`(child, name)`) only: those the target
    /// holds. A foreign key only the source has constrains nothing on the target, and in a
    /// writeset it would make every child row wait for every other of the same parent
    /// (pgbench's accounts of one branch). One the target holds without sluice knowing
    /// (`--initial none` into tables with their own keys) fails a moved row there, which is
    /// retried in source order (`schedule.rs`).
    pub fn set_target_foreign_keys(&mut self, fks: Vec<(TableRef, String)>) {
        self.target_fks = Some(fks);
        for h in 0..self.tables.len() {
            let t = &self.tables[h];
            let k = self.write_keys(self.keys.get(&t.table));
            let specs = TableKeySpecs::new(&t.table, &t.applied, k.as_ref());
            self.tables[h].specs = specs;
        }
    }

    /// `k` with the foreign keys the target does not hold left out.
    fn write_keys(&self, k: Option<&TableKeys>) -> Option<TableKeys> {
        let mut k = k?.clone();
        if let Some(fks) = &self.target_fks {
            let table = k.table.clone();
            k.foreign
                .retain(|f| fks.iter().any(|(c, n)| *c == table && *n == f.name));
        }
        Some(k)
    }

    /// A collector for `captured` tables with their `keys`.
    pub fn new(
        captured: Vec<Captured>,
        keys: Vec<TableKeys>,
        limits: Limits,
        source_engine: Engine,
    ) -> Self {
        let keys: HashMap<TableRef, TableKeys> =
            keys.into_iter().map(|k| (k.table.clone(), k)).collect();
        let mut c = Collector {
            tables: Vec::new(),
            by_ref: HashMap::new(),
            keys,
            target_fks: None,
            tx: TxMeta {
                pos: StreamPos::default(),
                xid: String::new(),
                commit_ts: None,
            },
            in_tx: false,
            cur: None,
            seq: 0,
            open: Open::default(),
            streaming: None,
            streamed_changes: 0,
            limits,
            source_engine,
            busy: None,
            handoff: None,
            scratch: Vec::new(),
            tx_rows: 0,
            last_pos: StreamPos::default(),
            skip: None,
            skipping: 0,
            ready: Vec::new(),
            restart: None,
            received: 0,
            ignored: 0,
        };
        for t in captured {
            let k = c.keys.get(&t.table);
            let (applied, keep) = applied_columns(&t.columns, k);
            let table = Table {
                specs: TableKeySpecs::new(&t.table, &applied, c.write_keys(k).as_ref()),
                key: Arc::new(key_of(&applied, k)),
                sole_key: sole_key(k),
                known: t.known.unwrap_or_else(|| SourceColumn::of(&applied)),
                applied: Arc::new(applied),
                keep,
                columns: Arc::new(t.columns),
                table: t.table.clone(),
                target: t.target,
                ignored: false,
                unknown: false,
                snapshot_position: t.snapshot_position,
                rows: None,
            };
            c.by_ref.insert(t.table, c.tables.len());
            c.tables.push(table);
        }
        c
    }

    /// Continue from `applied`: when it stands inside a transaction (a unit committed in two
    /// target transactions around a barrier), that transaction's first `skip` changes, and
    /// the barriers among them, are already applied and are passed over.
    pub fn resume_at(&mut self, applied: &AppliedPosition) {
        self.last_pos = applied.pos.clone();
        self.skip = (applied.skip > 0).then(|| (applied.pos.clone(), applied.skip));
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
            let batch = match &t.keep {
                Some(keep) => batch.project(keep)?,
                None => batch,
            };
            let arrays: Vec<ArrayRef> = batch.columns()[..t.applied.len()].to_vec();
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
                columns: t.applied.clone(),
                key: t.key.clone(),
                batch,
                source_engine: self.source_engine,
                sole_key: t.sole_key,
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
    pub fn advance_to(&mut self, received: &StreamPos) {
        let moved = self.restart.as_ref().is_none_or(|r| received > r);
        if self.in_tx || self.streaming.is_some() || self.open.end.is_some() || !moved {
            return;
        }
        self.restart = Some(received.clone());
        self.ready.push(Ready {
            work: Arc::new(Work {
                pieces: Vec::new(),
                more: None,
                position: Some(AppliedPosition {
                    unit: 0,
                    restart: received.clone(),
                    pos: received.clone(),
                    commit_ts: None,
                    skip: 0,
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

    /// A barrier after the open transaction's first `done` changes (none while passing over
    /// changes a restart found applied: they came before it).
    fn barrier(&mut self, b: Barrier, done: u64) -> Result<()> {
        if self.skipping > 0 {
            return Ok(());
        }
        self.close_rows()?;
        self.open.exclusive = true;
        // Every change before the barrier: the transactions before this one, and this one's
        // first `done`.
        let before = AppliedPosition {
            unit: 0,
            restart: self.restart.clone().unwrap_or_default(),
            pos: if done > 0 {
                self.tx.pos.clone()
            } else {
                self.last_pos.clone()
            },
            commit_ts: self.tx.commit_ts,
            skip: done,
        };
        self.send_or_keep(Piece::Barrier(b, before))
    }
}

impl ChangeSink for Collector {
    fn begin(&mut self, tx: TxMeta) -> Result<()> {
        self.tx_rows = 0;
        if let Some((pos, n)) = &self.skip {
            // Positions' text order is log order (`_pos`): an earlier transaction (none
            // touching the captured tables) may come first; a later one means the one the
            // target stands inside is gone.
            match tx.pos.order().cmp(pos.order()) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => {
                    self.skipping = *n;
                    self.skip = None;
                }
                std::cmp::Ordering::Greater => {
                    return Err(Error::source_permanent(format!(
                        "the target's applied position stands inside the source transaction at \
                         {pos} (its first {n} changes applied), but the source's log went on to \
                         {} without sending it again: the log was changed under the \
                         replication. Start the replication over (sluice replicate --drop, \
                         then run it again).",
                        tx.pos
                    )));
                }
            }
        }
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
                unknown: true,
                snapshot_position: None,
                known: Vec::new(),
                columns: Arc::new(Vec::new()),
                applied: Arc::new(Vec::new()),
                keep: None,
                key: Arc::new(Vec::new()),
                sole_key: false,
                specs: TableKeySpecs::default(),
                rows: None,
            });
            return Ok(self.tables.len() - 1);
        };
        if self.tables[h].ignored {
            return Ok(h);
        }
        let (applied, keep) = applied_columns(columns, self.keys.get(table));
        let sig = SourceColumn::of(&applied);
        let changed = self.tables[h].known != sig;
        if !changed && same_columns(&self.tables[h].columns, columns) {
            return Ok(h);
        }
        // Rows already gathered keep the builders they were built with.
        self.close_rows()?;
        if changed {
            let barrier = Barrier::Columns(ColumnChange {
                table: self.tables[h].target.clone(),
                before: std::mem::take(&mut self.tables[h].known),
                columns: applied.clone(),
                source_engine: self.source_engine,
            });
            self.barrier(barrier, self.tx_rows)?;
        }
        let k = self.keys.get(table);
        let specs = TableKeySpecs::new(table, &applied, self.write_keys(k).as_ref());
        let t = &mut self.tables[h];
        t.known = sig;
        t.specs = specs;
        t.key = Arc::new(key_of(&applied, k));
        t.sole_key = sole_key(k);
        t.applied = Arc::new(applied);
        t.keep = keep;
        t.columns = Arc::new(columns.to_vec());
        t.rows = None;
        Ok(h)
    }

    fn row(&mut self, table: usize, op: ChangeOp) -> Result<Option<&mut ChangeRows>> {
        self.cur = None;
        self.tx_rows += 1;
        if self.skipping > 0 {
            self.skipping -= 1;
            return Ok(None);
        }
        let t = &mut self.tables[table];
        if std::mem::take(&mut t.unknown) {
            tracing::warn!("{}", crate::job::uncaptured(&t.table.to_string()));
        }
        if t.ignored {
            self.ignored += 1;
            return Ok(None);
        }
        if in_table_snapshot(t.snapshot_position.as_ref(), &self.tx.pos) {
            return Ok(None);
        }
        if op == ChangeOp::Truncate {
            let name = t.target.clone();
            self.barrier(Barrier::Truncate(vec![name]), self.tx_rows - 1)?;
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
        if self.streaming.is_some() {
            self.streamed_changes += 1;
        }
        // A table without a key matches updates and deletes by whole rows, so they run alone;
        // its inserts commute with each other and with every other table's rows (the
        // writesets still carry its unique and foreign keys), so they do not.
        if self.tables[h].key.is_empty() && op != ChangeOp::Insert {
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

    fn in_tx(&self) -> bool {
        self.in_tx
    }

    fn commit(&mut self, restart: &StreamPos) -> Result<()> {
        self.in_tx = false;
        self.received += 1;
        self.restart = Some(restart.clone());
        self.last_pos.clone_from(&self.tx.pos);
        let end = AppliedPosition {
            unit: 0,
            restart: restart.clone(),
            pos: self.tx.pos.clone(),
            commit_ts: self.tx.commit_ts,
            skip: 0,
        };
        if self.streaming.is_some() {
            self.stream_rows()?;
            if let Some(tx) = self.streaming.take() {
                send(&tx, More::End(end, self.streamed_changes))?;
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
