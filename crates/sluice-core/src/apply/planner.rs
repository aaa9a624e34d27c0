//! The apply planner: a unit's rows as SQL text, written once for every target engine.
//!
//! A target session ([`super::ApplySession`]) buffers a unit as statements and sends them in as
//! few round trips as it can: [`Planner::begin`], [`Planner::apply`] and [`Planner::record`]
//! only write text; [`Planner::send`] sends the buffer (the runner is about to wait) and
//! [`Planner::commit`] sends what is left with `COMMIT`, so a unit that is already next to
//! commit costs one round trip, one that waits two. A buffer past [`FLUSH_BYTES`] is sent
//! early, so memory stays bounded for a large transaction.
//!
//! What the planner decides, the same for every engine:
//!
//! - consecutive inserts into one table carrying the same columns become one multi-row
//!   `INSERT` (a batch's inserts grouped by the columns they carry, groups in the order they
//!   first appear);
//! - a batch of updates or deletes of a keyed table ([`ApplyUnit::batches`]: rows sharing no
//!   key) becomes one statement per set of columns carried (groups in the order they first
//!   appear), each of at most [`ApplyDialect::UPDATE_ROWS`] / [`ApplyDialect::DELETE_ROWS`]
//!   rows;
//! - any other update or delete is one statement matched by the key, or, for a table without
//!   one, by every column the row carries (at most one row); an update that carries nothing
//!   but its key sets nothing and is left out;
//! - each update or delete expects as many rows as it names: the shortfall, read from the
//!   per-statement row counts the server returns, is [`Planner::unmatched`];
//! - once anything of the transaction was sent, a rollback must reach the server;
//! - a lock wait given up ([`Error::apply_blocked`]) rolls the transaction back and names who
//!   holds the lock.
//!
//! What differs per engine is an [`ApplyDialect`] (the text of values and statements) and an
//! [`ApplyLink`] (the round trip: send text, read per-statement row counts, classify errors,
//! name lock holders), both implemented by the adapter (`sluice-<engine>/src/apply/`). A
//! barrier's DDL is the adapter's too: it runs it through [`Planner::statement`] or on its own
//! connection between [`Planner::commit_interim`] and [`Planner::resume`].
//!
//! The dialect and link traits, and the unit table both read, are in `planner/dialect.rs`;
//! unit tests over a toy dialect (buffering, merging, grouping, chunking, the flush bound,
//! row-count accounting, rollbacks) in `planner/tests.rs`.

mod dialect;
pub mod fixture;
mod session;

pub use dialect::{ApplyDialect, ApplyLink, Lit, Many, Prepared, Recorder, push_list, try_list};
pub use session::{Barriers, PlannedSession};

use super::{AppliedPosition, ApplyUnit, UnitTable};
use crate::change::ChangeOp;
use crate::error::{Error, Result};
use crate::table::{ColumnDesc, TableRef};
use std::sync::Arc;

/// Buffered statement text is sent before the unit's end once it passes this many bytes.
pub const FLUSH_BYTES: usize = 1 << 20;

/// The multi-row insert being extended.
struct Open {
    table: TableRef,
    columns: Arc<Vec<ColumnDesc>>,
    carried: Vec<bool>,
}

impl Open {
    fn takes(&self, t: &UnitTable, carried: &[bool]) -> bool {
        self.table == t.table
            && self.carried == carried
            && (Arc::ptr_eq(&self.columns, &t.columns)
                || self
                    .columns
                    .iter()
                    .map(|c| &c.name)
                    .eq(t.columns.iter().map(|c| &c.name)))
    }
}

/// One apply session's statements (see the module documentation).
pub struct Planner<D> {
    dialect: D,
    name: String,
    worker: u32,
    buf: String,
    /// Per statement of `buf`, the rows an update or delete should match (`None` for others).
    expect: Vec<Option<u64>>,
    open: Option<Open>,
    /// Tables of the open transaction, for messages.
    tables: Vec<TableRef>,
    /// Something of the open transaction was sent (a rollback must reach the server).
    sent: bool,
    /// Updates and deletes of the open transaction that matched no row.
    missed: u64,
    /// The same for the last committed transaction.
    committed_missed: u64,
    /// Scratch: the columns the current row carries.
    carried: Vec<bool>,
    /// Scratch: the columns a statement names.
    cols: Vec<usize>,
}

impl<D: ApplyDialect> Planner<D> {
    /// The statements of worker `worker` of replication `name`, spelled by `dialect`.
    pub fn new(dialect: D, name: &str, worker: u32) -> Self {
        Planner {
            dialect,
            name: name.to_string(),
            worker,
            buf: String::new(),
            expect: Vec::new(),
            open: None,
            tables: Vec::new(),
            sent: false,
            missed: 0,
            committed_missed: 0,
            carried: Vec::new(),
            cols: Vec::new(),
        }
    }

    /// Start a transaction (buffered); whatever an earlier unit left is forgotten.
    pub fn begin(&mut self) {
        self.reset();
        self.tables.clear();
        self.sent = false;
        self.missed = 0;
        self.other(D::BEGIN);
    }

    /// Buffer the rows of `unit`, sending early past [`FLUSH_BYTES`].
    pub async fn apply<L: ApplyLink>(&mut self, unit: &ApplyUnit, link: &mut L) -> Result<()> {
        let prepared = unit
            .tables
            .iter()
            .map(|t| Prepared::new(&self.dialect, t))
            .collect::<Result<Vec<_>>>()?;
        for range in unit.batch_ranges() {
            let rows = &unit.order[range];
            let Some(&(t, first)) = rows.first() else {
                continue;
            };
            let p = prepared.get(t as usize).ok_or_else(|| {
                Error::internal(format!(
                    "an apply unit's order names table {t}, which it lacks"
                ))
            })?;
            self.touch(&p.t.table);
            let op = p.op(first as usize)?;
            if rows.len() > 1 && !p.key.is_empty() && op != ChangeOp::Insert {
                self.many(p, op, rows, link).await?;
                continue;
            }
            let mut ordered: Vec<usize> = rows.iter().map(|&(_, r)| r as usize).collect();
            if op == ChangeOp::Insert && rows.len() > 1 {
                self.by_columns(p, &mut ordered);
            }
            for r in ordered {
                self.row(p, r)?;
                if self.buf.len() > FLUSH_BYTES {
                    self.flush(link).await?;
                }
            }
        }
        Ok(())
    }

    /// Buffer the upsert of this worker's applied position.
    pub fn record(&mut self, position: &AppliedPosition) {
        self.close();
        self.dialect
            .position(&self.name, self.worker, position, &mut self.buf);
        self.end(None);
    }

    /// Buffer the upsert of the source columns `table` follows (`columns_json`: the
    /// adapter's bookkeeping JSON of them).
    pub fn followed(&mut self, table: &TableRef, columns_json: &str) {
        self.close();
        self.dialect
            .followed(&self.name, table, columns_json, &mut self.buf);
        self.end(None);
    }

    /// Buffer `sql` as it is (a barrier's DDL: complete statements, no row expected).
    pub fn statement(&mut self, sql: &str) {
        self.close();
        self.buf.push_str(sql);
        self.expect.push(None);
    }

    /// Name `table` in the messages of the open transaction (a barrier's tables).
    pub fn touch(&mut self, table: &TableRef) {
        if !self.tables.contains(table) {
            self.tables.push(table.clone());
        }
    }

    /// Send what is buffered; the transaction stays open.
    pub async fn send<L: ApplyLink>(&mut self, link: &mut L) -> Result<()> {
        self.flush(link).await
    }

    /// Send what is buffered with `COMMIT`.
    pub async fn commit<L: ApplyLink>(&mut self, link: &mut L) -> Result<()> {
        self.commit_interim(link).await?;
        self.committed_missed = std::mem::take(&mut self.missed);
        Ok(())
    }

    /// Commit what the transaction holds but keep counting the unit (a barrier whose DDL
    /// commits by itself runs after this); [`Planner::resume`] opens the next transaction.
    pub async fn commit_interim<L: ApplyLink>(&mut self, link: &mut L) -> Result<()> {
        self.close();
        self.buf.push_str(D::COMMIT);
        self.expect.push(None);
        self.flush(link).await?;
        self.sent = false;
        Ok(())
    }

    /// Open the unit's next transaction (buffered) after [`Planner::commit_interim`].
    pub fn resume(&mut self) {
        self.other(D::BEGIN);
    }

    /// Forget what is buffered and roll back what was sent.
    pub async fn rollback<L: ApplyLink>(&mut self, link: &mut L) -> Result<()> {
        self.reset();
        if !std::mem::take(&mut self.sent) {
            return Ok(());
        }
        link.rollback().await
    }

    /// Updates and deletes of the last committed transaction that matched no row.
    pub fn unmatched(&self) -> u64 {
        self.committed_missed
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.expect.clear();
        self.open = None;
    }

    /// End the statement just written.
    fn end(&mut self, expect: Option<u64>) {
        self.buf.push_str(D::END);
        self.expect.push(expect);
    }

    fn other(&mut self, sql: &str) {
        self.close();
        self.buf.push_str(sql);
        self.end(None);
    }

    /// End the multi-row insert being extended, if any.
    fn close(&mut self) {
        if self.open.take().is_some() {
            self.end(None);
        }
    }

    /// Send the buffer and count the updates and deletes that matched no row.
    async fn flush<L: ApplyLink>(&mut self, link: &mut L) -> Result<()> {
        self.close();
        if self.buf.is_empty() {
            return Ok(());
        }
        self.sent = true;
        let result = link.send(&self.buf, &self.tables).await;
        self.buf.clear();
        let counts = match result {
            Ok(c) => c,
            Err(e) => {
                self.expect.clear();
                if !e.is_apply_blocked() {
                    return Err(e);
                }
                // Name who holds the lock; the transaction is lost anyway.
                self.sent = false;
                let _ = link.rollback().await;
                let who = link.holders(&self.tables).await;
                return Err(Error::apply_blocked(format!("{} {who}", e.message())));
            }
        };
        if counts.len() < self.expect.len() {
            tracing::debug!(
                "{} statement results for {} statements sent",
                counts.len(),
                self.expect.len()
            );
        }
        let missed: u64 = self
            .expect
            .iter()
            .zip(&counts)
            .filter_map(|(want, got)| want.map(|w| w.saturating_sub(*got)))
            .sum();
        self.expect.clear();
        if missed > 0 {
            self.missed += missed;
            tracing::debug!("{missed} update(s) or delete(s) matched no row on the target");
        }
        Ok(())
    }

    /// Order a batch's inserts (rows that may go in any order) by the columns they carry, so
    /// that each set extends one multi-row `INSERT`: sets in the order they first appear.
    fn by_columns(&mut self, p: &Prepared<'_, D::Columns>, rows: &mut [usize]) {
        let mut masks: Vec<Vec<bool>> = Vec::new();
        let mut group = Vec::with_capacity(rows.len());
        for &r in rows.iter() {
            p.carried(r, &mut self.carried);
            let g = match masks.iter().position(|m| *m == self.carried) {
                Some(g) => g,
                None => {
                    masks.push(self.carried.clone());
                    masks.len() - 1
                }
            };
            group.push(g);
        }
        if masks.len() > 1 {
            let mut keyed: Vec<(usize, usize)> =
                group.into_iter().zip(rows.iter().copied()).collect();
            keyed.sort_by_key(|(g, _)| *g);
            for (slot, (_, r)) in rows.iter_mut().zip(keyed) {
                *slot = r;
            }
        }
    }

    /// A batch of updates or deletes of a keyed table (rows sharing no key): one statement per
    /// set of columns carried and per [`ApplyDialect::UPDATE_ROWS`] / `DELETE_ROWS` rows.
    async fn many<L: ApplyLink>(
        &mut self,
        p: &Prepared<'_, D::Columns>,
        op: ChangeOp,
        rows: &[(u32, u32)],
        link: &mut L,
    ) -> Result<()> {
        self.close();
        let update = op == ChangeOp::Update;
        // Deletes carry their key: one group.
        self.carried.clear();
        let mut groups: Vec<(Vec<bool>, Vec<usize>)> = Vec::new();
        for &(_, r) in rows {
            let r = r as usize;
            if update {
                p.carried(r, &mut self.carried);
            }
            match groups.iter_mut().find(|(m, _)| *m == self.carried) {
                Some((_, g)) => g.push(r),
                None => groups.push((self.carried.clone(), vec![r])),
            }
        }
        let size = if update {
            D::UPDATE_ROWS
        } else {
            D::DELETE_ROWS
        };
        for (mask, group) in &groups {
            let set: Vec<usize> = (0..mask.len())
                .filter(|i| update && mask[*i] && !p.key.contains(i))
                .collect();
            if update && set.is_empty() {
                continue;
            }
            for chunk in group.chunks(size) {
                let many = Many {
                    set: &set,
                    rows: chunk,
                };
                if update {
                    self.dialect.update_many(p, many, &mut self.buf)?;
                } else {
                    self.dialect.delete_many(p, many, &mut self.buf)?;
                }
                self.end(Some(chunk.len() as u64));
                if self.buf.len() > FLUSH_BYTES {
                    self.flush(link).await?;
                }
            }
        }
        Ok(())
    }

    /// Row `r` of `p`: a statement, or one more row of the insert being extended.
    fn row(&mut self, p: &Prepared<'_, D::Columns>, r: usize) -> Result<()> {
        let op = p.op(r)?;
        p.carried(r, &mut self.carried);
        if op == ChangeOp::Insert {
            return self.insert(p, r);
        }
        self.close();
        let key = !p.key.is_empty();
        if op == ChangeOp::Update {
            self.cols.clear();
            self.cols
                .extend((0..self.carried.len()).filter(|i| self.carried[*i] && !p.key.contains(i)));
            if self.cols.is_empty() {
                return Ok(());
            }
            self.dialect.update_head(p, &self.cols, r, &mut self.buf)?;
        } else {
            self.dialect.delete_head(p, &mut self.buf);
        }
        self.cols.clear();
        if key {
            self.cols.extend_from_slice(&p.key);
        } else {
            self.cols
                .extend((0..self.carried.len()).filter(|i| self.carried[*i]));
        }
        self.dialect.row_where(p, &self.cols, r, &mut self.buf)?;
        self.end(Some(1));
        Ok(())
    }

    fn insert(&mut self, p: &Prepared<'_, D::Columns>, r: usize) -> Result<()> {
        if !self.carried.contains(&true)
            && let Some(sql) = self.dialect.default_values(p)
        {
            self.close();
            self.buf.push_str(&sql);
            self.end(None);
            return Ok(());
        }
        self.cols.clear();
        self.cols
            .extend((0..self.carried.len()).filter(|i| self.carried[*i]));
        if self
            .open
            .as_ref()
            .is_some_and(|o| o.takes(p.t, &self.carried))
        {
            self.buf.push_str(D::ROW_SEP);
        } else {
            self.close();
            self.dialect.insert_head(p, &self.cols, &mut self.buf);
            self.open = Some(Open {
                table: p.t.table.clone(),
                columns: p.t.columns.clone(),
                carried: self.carried.clone(),
            });
        }
        self.dialect.insert_row(p, &self.cols, r, &mut self.buf)
    }
}

#[cfg(test)]
mod tests;
