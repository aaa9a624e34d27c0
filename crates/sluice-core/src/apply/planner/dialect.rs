//! What an engine supplies to the planner: its [`ApplyDialect`] (the text of statements) and
//! its [`ApplyLink`] (the round trip); [`Prepared`], the unit table both read; [`Recorder`], a
//! link without a server for tests of a dialect.

use crate::apply::{AppliedPosition, UnitTable};
use crate::change::{ABSENT, ChangeOp, OP};
use crate::error::{Error, Result};
use crate::table::TableRef;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ListArray, StringArray};
use async_trait::async_trait;

/// How one engine spells what the planner writes. Every method appends to `buf` and writes
/// no statement terminator: the planner adds [`ApplyDialect::END`] where a statement ends.
/// The constants' defaults are the compact spelling every SQL engine reads; a dialect
/// overrides those it spells otherwise.
///
/// Values must be written so that no value can end a literal or a statement (quoted, hex or
/// formatted by the dialect itself): the buffer carries many statements in one message.
pub trait ApplyDialect: Send {
    /// What the dialect works out once per table of a unit (how each column's values are
    /// written), given to every method as [`Prepared::cols`].
    type Columns: Send + Sync;

    /// The character that quotes an identifier (doubled inside it).
    const QUOTE: char;
    /// Rows of one batched `UPDATE` at most.
    const UPDATE_ROWS: usize = 1000;
    /// Rows of one batched `DELETE` at most.
    const DELETE_ROWS: usize = 1000;
    /// What ends a statement that others follow (`;`, maybe with a line break).
    const END: &'static str = ";";
    /// What separates the rows of a multi-row `INSERT`.
    const ROW_SEP: &'static str = ",";
    /// The statement that opens a transaction.
    const BEGIN: &'static str = "BEGIN";
    /// The statement that commits it (always the buffer's last).
    const COMMIT: &'static str = "COMMIT";
    /// What separates the items of a list in a statement (column names, a row's values).
    const LIST_SEP: &'static str = ",";
    /// What follows `VALUES` of a multi-row `INSERT` before its first row.
    const VALUES_SEP: &'static str = " ";
    /// What stands between a column and its value in `SET`.
    const ASSIGN: &'static str = "=";

    /// The per-table state of `t` (an error when a column's values cannot be written).
    fn columns(&self, t: &UnitTable) -> Result<Self::Columns>;

    /// Row `r`'s value of column `c` as a literal.
    fn value(
        &mut self,
        p: &Prepared<'_, Self::Columns>,
        c: usize,
        r: usize,
        buf: &mut String,
    ) -> Result<()>;

    /// `text` as a text literal (the bookkeeping's names, positions and JSON).
    fn text(&mut self, text: &str, buf: &mut String);

    /// What turns the bookkeeping's `INSERT` into an upsert: on a row with the same `key`
    /// columns, set `set` from the inserted row and the row's time of update to now (both
    /// lists quoted already).
    fn on_conflict(&mut self, key: &[&str], set: &[&str], buf: &mut String);

    /// `INSERT INTO t (cols) VALUES`, up to where the first row starts.
    fn insert_head(&mut self, p: &Prepared<'_, Self::Columns>, cols: &[usize], buf: &mut String) {
        buf.push_str("INSERT INTO ");
        buf.push_str(&p.table);
        buf.push_str(" (");
        push_list(buf, Self::LIST_SEP, cols, |buf, &c| {
            buf.push_str(&p.names[c])
        });
        buf.push_str(") VALUES");
        buf.push_str(Self::VALUES_SEP);
    }

    /// Row `r` of a multi-row `INSERT`: `(v, …)` of columns `cols`.
    fn insert_row(
        &mut self,
        p: &Prepared<'_, Self::Columns>,
        cols: &[usize],
        r: usize,
        buf: &mut String,
    ) -> Result<()> {
        buf.push('(');
        try_list(buf, Self::LIST_SEP, cols, |buf, &c| {
            self.value(p, c, r, buf)
        })?;
        buf.push(')');
        Ok(())
    }

    /// The whole statement inserting a row that carries no column, or `None` when the
    /// engine's `INSERT` takes an empty column list (the row joins a multi-row `INSERT`).
    fn default_values(&mut self, p: &Prepared<'_, Self::Columns>) -> Option<String>;

    /// `UPDATE t SET c = v, …` of row `r`'s columns `set` (never empty), up to its `WHERE`.
    fn update_head(
        &mut self,
        p: &Prepared<'_, Self::Columns>,
        set: &[usize],
        r: usize,
        buf: &mut String,
    ) -> Result<()> {
        buf.push_str("UPDATE ");
        buf.push_str(&p.table);
        buf.push_str(" SET ");
        try_list(buf, Self::LIST_SEP, set, |buf, &c| {
            buf.push_str(&p.names[c]);
            buf.push_str(Self::ASSIGN);
            self.value(p, c, r, buf)
        })
    }

    /// `DELETE FROM t`, up to its `WHERE`.
    fn delete_head(&mut self, p: &Prepared<'_, Self::Columns>, buf: &mut String) {
        buf.push_str("DELETE FROM ");
        buf.push_str(&p.table);
    }

    /// The ` WHERE …` that makes a single-row update or delete match row `r` by columns
    /// `cols`: the key (where a key column is NULL, it matches NULL), or, when `p.key` is
    /// empty, every column the row carries, touching at most one row.
    fn row_where(
        &mut self,
        p: &Prepared<'_, Self::Columns>,
        cols: &[usize],
        r: usize,
        buf: &mut String,
    ) -> Result<()>;

    /// One `UPDATE` of `many.rows` of a keyed table (at most [`ApplyDialect::UPDATE_ROWS`],
    /// sharing no key, each carrying columns `many.set`, never empty, besides the key),
    /// matched by key.
    fn update_many(
        &mut self,
        p: &Prepared<'_, Self::Columns>,
        many: Many<'_>,
        buf: &mut String,
    ) -> Result<()>;

    /// One `DELETE` of `many.rows` of a keyed table (at most [`ApplyDialect::DELETE_ROWS`],
    /// sharing no key), matched by key (`many.set` is empty).
    fn delete_many(
        &mut self,
        p: &Prepared<'_, Self::Columns>,
        many: Many<'_>,
        buf: &mut String,
    ) -> Result<()>;

    /// The upsert of worker `worker`'s applied position of replication `name` (see
    /// [`crate::apply::ApplySession::record`]) into `sluice.applied`.
    fn position(&mut self, name: &str, worker: u32, position: &AppliedPosition, buf: &mut String) {
        let ts = position
            .commit_ts
            .map_or("NULL".into(), |ts| ts.to_string());
        self.upsert(
            "applied",
            &[
                "name",
                "worker",
                "unit",
                "restart",
                "pos",
                "commit_ts",
                "skip",
            ],
            2,
            &[
                Lit::Text(name),
                Lit::Raw(&worker.to_string()),
                Lit::Raw(&position.unit.to_string()),
                Lit::Text(position.restart.as_str()),
                Lit::Text(position.pos.as_str()),
                Lit::Raw(&ts),
                Lit::Raw(&position.skip.to_string()),
            ],
            buf,
        );
    }

    /// The upsert of the source columns `table` of replication `name` follows, as the JSON the
    /// adapter's bookkeeping reads back (see [`crate::apply::ApplySession::columns`]), into
    /// `sluice.columns`.
    fn followed(&mut self, name: &str, table: &TableRef, columns_json: &str, buf: &mut String) {
        self.upsert(
            "columns",
            &["name", "table_schema", "table_name", "columns"],
            3,
            &[
                Lit::Text(name),
                Lit::Text(&table.schema),
                Lit::Text(&table.name),
                Lit::Text(columns_json),
            ],
            buf,
        );
    }

    /// `INSERT INTO sluice.<table> (cols) VALUES (values)` and the dialect's
    /// [`ApplyDialect::on_conflict`] over the first `key` columns.
    fn upsert(
        &mut self,
        table: &str,
        cols: &[&str],
        key: usize,
        values: &[Lit<'_>],
        buf: &mut String,
    ) {
        let quote = |name: &str| crate::ident::enclose(name, Self::QUOTE);
        let quoted: Vec<String> = cols.iter().map(|c| quote(c)).collect();
        let quoted: Vec<&str> = quoted.iter().map(String::as_str).collect();
        buf.push_str("INSERT INTO ");
        buf.push_str(&quote("sluice"));
        buf.push('.');
        buf.push_str(&quote(table));
        buf.push_str(" (");
        push_list(buf, Self::LIST_SEP, &quoted, |buf, c| buf.push_str(c));
        buf.push_str(") VALUES (");
        push_list(buf, Self::LIST_SEP, values, |buf, v| match v {
            Lit::Text(t) => self.text(t, buf),
            Lit::Raw(r) => buf.push_str(r),
        });
        buf.push(')');
        let (key, set) = quoted.split_at(key);
        self.on_conflict(key, set, buf);
    }
}

/// A value of a bookkeeping statement.
pub enum Lit<'a> {
    /// Text, written by [`ApplyDialect::text`].
    Text(&'a str),
    /// SQL written as it is (a number, `NULL`).
    Raw(&'a str),
}

/// The rows of one batched statement and the columns they set besides the key (none for a
/// delete).
#[derive(Clone, Copy)]
pub struct Many<'a> {
    /// Columns set (indexes in [`UnitTable::columns`]).
    pub set: &'a [usize],
    /// The rows.
    pub rows: &'a [usize],
}

/// Each of `items` written by `f`, separated by `sep`.
pub fn push_list<T>(buf: &mut String, sep: &str, items: &[T], mut f: impl FnMut(&mut String, &T)) {
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            buf.push_str(sep);
        }
        f(buf, item);
    }
}

/// [`push_list`] with a writer that can fail (the first error ends the list).
pub fn try_list<T>(
    buf: &mut String,
    sep: &str,
    items: &[T],
    mut f: impl FnMut(&mut String, &T) -> Result<()>,
) -> Result<()> {
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            buf.push_str(sep);
        }
        f(buf, item)?;
    }
    Ok(())
}

/// One target connection's round trip, for the planner.
#[async_trait]
pub trait ApplyLink: Send {
    /// Send `sql` (statements ended by the dialect's [`ApplyDialect::END`]) inside the open
    /// transaction; each statement's affected rows in order (the rows an update matched, not
    /// only those it changed). An error is classified: [`Error::apply_conflict`] when
    /// ordering may explain it, [`Error::apply_blocked`] for a lock wait given up, transient
    /// for a lost connection, permanent otherwise; `tables` (those of the open transaction)
    /// are for its message.
    async fn send(&mut self, sql: &str, tables: &[TableRef]) -> Result<Vec<u64>>;

    /// Roll the open transaction back: `ROLLBACK` sent as any statement is (every SQL engine
    /// spells it so).
    async fn rollback(&mut self) -> Result<()> {
        self.send("ROLLBACK", &[]).await.map(|_| ())
    }

    /// A sentence naming the sessions that may hold a lock on `tables`, for the message of a
    /// lock wait given up (never fails: it says so when it cannot tell).
    async fn holders(&mut self, tables: &[TableRef]) -> String;
}

/// A unit table prepared for the dialect: its key columns, its change columns and what the
/// dialect worked out.
pub struct Prepared<'a, C> {
    /// The table's rows.
    pub t: &'a UnitTable,
    /// Indexes in [`UnitTable::columns`] of the key (empty: the table has no key).
    pub key: Vec<usize>,
    /// The table's name, quoted.
    pub table: String,
    /// Each column's name, quoted.
    pub names: Vec<String>,
    /// The dialect's per-table state ([`ApplyDialect::columns`]).
    pub cols: C,
    op: &'a StringArray,
    absent: &'a ListArray,
}

impl<'a, C> Prepared<'a, C> {
    /// `t` prepared for `dialect`.
    pub(super) fn new<D: ApplyDialect<Columns = C>>(dialect: &D, t: &'a UnitTable) -> Result<Self> {
        let schema = t.batch.schema_ref();
        let column = |name: &str| {
            schema
                .index_of(name)
                .map(|i| t.batch.column(i))
                .map_err(|_| Error::internal(format!("the rows of {} lack column {name}", t.table)))
        };
        let op = column(OP)?
            .as_string_opt::<i32>()
            .ok_or_else(|| Error::internal(format!("column {OP} of {} is not text", t.table)))?;
        let absent = column(ABSENT)?.as_list_opt::<i32>().ok_or_else(|| {
            Error::internal(format!("column {ABSENT} of {} is not a list", t.table))
        })?;
        Ok(Prepared {
            t,
            key: t.key_positions()?,
            table: format!(
                "{}.{}",
                crate::ident::enclose(&t.table.schema, D::QUOTE),
                crate::ident::enclose(&t.table.name, D::QUOTE)
            ),
            names: t
                .columns
                .iter()
                .map(|c| crate::ident::enclose(&c.name, D::QUOTE))
                .collect(),
            cols: dialect.columns(t)?,
            op,
            absent,
        })
    }

    /// What row `r` does.
    pub fn op(&self, r: usize) -> Result<ChangeOp> {
        let text = self.op.value(r);
        match ChangeOp::parse(text) {
            Some(op @ (ChangeOp::Insert | ChangeOp::Update | ChangeOp::Delete)) => Ok(op),
            _ => Err(Error::internal(format!(
                "a {text:?} change of {} reached an apply unit; only inserts, updates and \
                 deletes are applied in units",
                self.t.table
            ))),
        }
    }

    /// Which columns row `r` carries (`mask[i]` false for a column `_absent` names).
    pub fn carried(&self, r: usize, mask: &mut Vec<bool>) {
        mask.clear();
        mask.resize(self.t.columns.len(), true);
        if self.absent.is_null(r) || self.absent.value_length(r) == 0 {
            return;
        }
        let list = self.absent.value(r);
        let Some(names) = list.as_string_opt::<i32>() else {
            return;
        };
        for name in names.iter().flatten() {
            if let Some(i) = self.t.columns.iter().position(|c| c.name == name) {
                mask[i] = false;
            }
        }
    }
}

/// An [`ApplyLink`] without a server: it keeps each buffer it is sent and answers with no row
/// counts (so nothing counts as unmatched). What a dialect's tests read a unit's statements
/// from.
#[derive(Debug, Default)]
pub struct Recorder {
    /// The buffers sent, in order.
    pub sent: Vec<String>,
    /// Rollbacks sent.
    pub rollbacks: usize,
}

#[async_trait]
impl ApplyLink for Recorder {
    async fn send(&mut self, sql: &str, _tables: &[TableRef]) -> Result<Vec<u64>> {
        self.sent.push(sql.to_string());
        Ok(Vec::new())
    }

    async fn rollback(&mut self) -> Result<()> {
        self.rollbacks += 1;
        Ok(())
    }

    async fn holders(&mut self, _tables: &[TableRef]) -> String {
        String::new()
    }
}
