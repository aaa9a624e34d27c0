//! One apply worker's session: a unit's rows as SQL text, sent in at most two round trips.
//!
//! `begin` and `apply` only write statements into a buffer; `record` appends the position
//! upsert and sends the buffer as one multi-statement batch (round trip one), `commit` sends
//! `COMMIT` (round trip two). Consecutive inserts into one table with the same columns become
//! one multi-row `INSERT`. A buffer past [`FLUSH_BYTES`] is sent early, so memory stays bounded
//! for a large transaction.
//!
//! Statements: an insert names the columns the row carries; an update sets the non-key columns
//! the row carries (`_absent` ones keep their value) where the key columns equal the row's; a
//! delete matches the key. A table without a key matches every column the row carries with
//! `<=>` (NULL matches NULL) and touches at most one row (`LIMIT 1`). An update or delete that
//! matches no row changes nothing: the source said the row existed, so it is not an error.

use super::fail;
use super::render::{self, Kind};
use crate::sql::{quote_ident, quote_table};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, StringArray};
use async_trait::async_trait;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyUnit, Barrier, UnitTable};
use sluice_core::change::{ABSENT, OP};
use sluice_core::{Error, Result};

/// A buffer of statements past this many bytes is sent before the unit ends.
const FLUSH_BYTES: usize = 1 << 20;

/// An apply session (see the module documentation).
pub struct MySession {
    conn: Conn,
    display: String,
    name: String,
    worker: u32,
    /// MySQL (not MariaDB): JSON columns compare with `CAST(… AS JSON)`.
    mysql_json: bool,
    same_engine: bool,
    buf: String,
    /// Statements of the open transaction already sent (a rollback must reach the server).
    sent: bool,
    /// Tables of the open transaction, for messages.
    tables: Vec<String>,
}

/// One table of a unit, ready to render rows.
struct Prepared<'a> {
    t: &'a UnitTable,
    name: String,
    cols: Vec<(String, Kind, &'a ArrayRef)>,
    op: &'a StringArray,
    absent: &'a ListArray,
    key: Vec<usize>,
}

impl<'a> Prepared<'a> {
    fn new(t: &'a UnitTable) -> Result<Self> {
        let batch = &t.batch;
        let schema = batch.schema_ref().clone();
        let col = |name: &str| {
            schema.index_of(name).map_err(|_| {
                Error::internal(format!("the unit's rows of {} lack column {name}", t.table))
            })
        };
        let op = batch
            .column(col(OP)?)
            .as_string_opt::<i32>()
            .ok_or_else(|| Error::internal(format!("column {OP} of {} is not text", t.table)))?;
        let absent = batch
            .column(col(ABSENT)?)
            .as_list_opt::<i32>()
            .ok_or_else(|| {
                Error::internal(format!("column {ABSENT} of {} is not a list", t.table))
            })?;
        let cols: Vec<(String, Kind, &ArrayRef)> = t
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| (quote_ident(&c.name), Kind::of(&c.field), batch.column(i)))
            .collect();
        let key = t
            .key
            .iter()
            .map(|k| {
                t.columns.iter().position(|c| &c.name == k).ok_or_else(|| {
                    Error::internal(format!("key column {k} is not a column of {}", t.table))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Prepared {
            t,
            name: quote_table(&t.table),
            cols,
            op,
            absent,
            key,
        })
    }

    /// Which columns row `r` carries.
    fn present(&self, r: usize) -> Vec<bool> {
        let mut p = vec![true; self.cols.len()];
        if self.absent.is_valid(r) && self.absent.value_length(r) > 0 {
            let names = self.absent.value(r);
            if let Some(names) = names.as_string_opt::<i32>() {
                for n in names.iter().flatten() {
                    if let Some(i) = self.t.columns.iter().position(|c| c.name == n) {
                        p[i] = false;
                    }
                }
            }
        }
        p
    }
}

impl MySession {
    pub(super) fn new(
        conn: Conn,
        display: String,
        name: &str,
        worker: u32,
        mysql_json: bool,
        same_engine: bool,
    ) -> Self {
        MySession {
            conn,
            display,
            name: name.to_string(),
            worker,
            mysql_json,
            same_engine,
            buf: String::new(),
            sent: false,
            tables: Vec::new(),
        }
    }

    fn what(&self) -> String {
        match self.tables.len() {
            0 => "applying a unit to".to_string(),
            _ => format!("applying a unit ({}) to", self.tables.join(", ")),
        }
    }

    async fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let sql = std::mem::take(&mut self.buf);
        self.sent = true;
        let r = self.conn.query_drop(sql.as_str()).await;
        // Keep the allocation for the next unit.
        self.buf = sql;
        self.buf.clear();
        r.map_err(|e| fail(e, &self.display, &self.what()))
    }

    fn push_where(&mut self, p: &Prepared<'_>, r: usize, present: &[bool]) -> Result<()> {
        let keyless = p.key.is_empty();
        let cols: Vec<usize> = if keyless {
            (0..p.cols.len()).filter(|&i| present[i]).collect()
        } else {
            p.key.clone()
        };
        self.buf.push_str(" WHERE ");
        for (n, &i) in cols.iter().enumerate() {
            if n > 0 {
                self.buf.push_str(" AND ");
            }
            let (name, kind, array) = &p.cols[i];
            let column = &p.t.columns[i].name;
            if *kind == Kind::Wkb {
                self.buf.push_str("ST_AsBinary(");
                self.buf.push_str(name);
                self.buf.push_str(") <=> ");
                let mut v = String::new();
                render::value(&mut v, Kind::Plain, array, r, column)?;
                self.buf.push_str(&v);
                continue;
            }
            self.buf.push_str(name);
            if array.is_null(r) {
                self.buf.push_str(" IS NULL");
                continue;
            }
            self.buf.push_str(if keyless { " <=> " } else { " = " });
            let json = *kind == Kind::Json && self.mysql_json;
            if json {
                self.buf.push_str("CAST(");
            }
            render::value(&mut self.buf, *kind, array, r, column)?;
            if json {
                self.buf.push_str(" AS JSON)");
            }
        }
        if keyless {
            self.buf.push_str(" LIMIT 1");
        }
        self.buf.push(';');
        Ok(())
    }

    fn push_row(&mut self, p: &Prepared<'_>, r: usize, present: &[bool]) -> Result<()> {
        self.buf.push('(');
        let mut first = true;
        for (i, (_, kind, array)) in p.cols.iter().enumerate() {
            if !present[i] {
                continue;
            }
            if !first {
                self.buf.push(',');
            }
            first = false;
            render::value(&mut self.buf, *kind, array, r, &p.t.columns[i].name)?;
        }
        self.buf.push(')');
        Ok(())
    }
}

#[async_trait]
impl ApplySession for MySession {
    async fn begin(&mut self) -> Result<()> {
        self.buf.clear();
        self.tables.clear();
        self.sent = false;
        self.buf.push_str("START TRANSACTION;");
        Ok(())
    }

    async fn apply(&mut self, unit: &ApplyUnit) -> Result<()> {
        let prepared = unit
            .tables
            .iter()
            .map(Prepared::new)
            .collect::<Result<Vec<_>>>()?;
        for p in &prepared {
            let n = p.t.table.to_string();
            if !self.tables.contains(&n) {
                self.tables.push(n);
            }
        }
        // The insert being extended: (table, the columns its rows carry).
        let mut open: Option<(u32, Vec<bool>)> = None;
        for &(ti, ri) in &unit.order {
            let p = prepared.get(ti as usize).ok_or_else(|| {
                Error::internal(format!("unit order names table {ti}, which it lacks"))
            })?;
            let r = ri as usize;
            let present = p.present(r);
            let op = p.op.value(r);
            if op == "insert" {
                if matches!(&open, Some((t, cols)) if *t == ti && *cols == present) {
                    self.buf.push(',');
                } else {
                    if open.take().is_some() {
                        self.buf.push(';');
                    }
                    self.buf.push_str("INSERT INTO ");
                    self.buf.push_str(&p.name);
                    self.buf.push_str(" (");
                    let names: Vec<&str> = p
                        .cols
                        .iter()
                        .zip(&present)
                        .filter(|(_, keep)| **keep)
                        .map(|((n, _, _), _)| n.as_str())
                        .collect();
                    self.buf.push_str(&names.join(","));
                    self.buf.push_str(") VALUES ");
                    open = Some((ti, present.clone()));
                }
                self.push_row(p, r, &present)?;
                if self.buf.len() > FLUSH_BYTES {
                    self.buf.push(';');
                    open = None;
                    self.flush().await?;
                }
                continue;
            }
            if open.take().is_some() {
                self.buf.push(';');
            }
            match op {
                "update" => {
                    let set: Vec<usize> = (0..p.cols.len())
                        .filter(|i| present[*i] && (p.key.is_empty() || !p.key.contains(i)))
                        .collect();
                    if set.is_empty() {
                        continue;
                    }
                    self.buf.push_str("UPDATE ");
                    self.buf.push_str(&p.name);
                    self.buf.push_str(" SET ");
                    for (n, &i) in set.iter().enumerate() {
                        if n > 0 {
                            self.buf.push(',');
                        }
                        let (name, kind, array) = &p.cols[i];
                        self.buf.push_str(name);
                        self.buf.push('=');
                        render::value(&mut self.buf, *kind, array, r, &p.t.columns[i].name)?;
                    }
                    self.push_where(p, r, &present)?;
                }
                "delete" => {
                    self.buf.push_str("DELETE FROM ");
                    self.buf.push_str(&p.name);
                    self.push_where(p, r, &present)?;
                }
                other => {
                    return Err(Error::internal(format!(
                        "a unit holds a {other:?} change of {}; only insert, update and delete \
                         are applied in units",
                        p.t.table
                    )));
                }
            }
            if self.buf.len() > FLUSH_BYTES {
                self.flush().await?;
            }
        }
        if open.is_some() {
            self.buf.push(';');
        }
        Ok(())
    }

    async fn barrier(&mut self, barrier: &Barrier) -> Result<()> {
        self.flush().await?;
        match barrier {
            Barrier::Truncate(tables) => {
                for t in tables {
                    // DDL: commits by itself; truncating twice leaves the same empty table.
                    self.conn
                        .query_drop(format!("TRUNCATE TABLE {}", quote_table(t)))
                        .await
                        .map_err(|e| fail(e, &self.display, &format!("truncating {t} on")))?;
                }
            }
            Barrier::Columns { table, columns } => {
                let have = super::columns_of(&mut self.conn, table, &self.display).await?;
                if have.is_empty() {
                    return Err(Error::config(format!(
                        "the target table {table} is missing on {}; drop the replication's \
                         state and start again with an initial load",
                        self.display
                    )));
                }
                if let Some(sql) =
                    super::ddl::alter_columns(table, &have, columns, self.same_engine)
                {
                    self.conn
                        .query_drop(sql)
                        .await
                        .map_err(|e| fail(e, &self.display, &format!("altering {table} on")))?;
                }
            }
        }
        // The DDL committed; what follows runs in a transaction of its own.
        self.buf.push_str("START TRANSACTION;");
        Ok(())
    }

    async fn record(&mut self, position: &AppliedPosition) -> Result<()> {
        use std::fmt::Write;
        let _ = write!(
            self.buf,
            "INSERT INTO `sluice`.`applied` (`name`,`worker`,`unit`,`restart`,`pos`,\
             `commit_ts`) VALUES ("
        );
        render::push_text(&mut self.buf, &self.name);
        let _ = write!(self.buf, ",{},{},", self.worker, position.unit);
        render::push_text(&mut self.buf, &position.restart);
        self.buf.push(',');
        render::push_text(&mut self.buf, &position.pos);
        match position.commit_ts {
            Some(ts) => {
                let _ = write!(self.buf, ",{ts})");
            }
            None => self.buf.push_str(",NULL)"),
        }
        self.buf.push_str(
            " ON DUPLICATE KEY UPDATE `unit`=VALUES(`unit`),`restart`=VALUES(`restart`),\
             `pos`=VALUES(`pos`),`commit_ts`=VALUES(`commit_ts`),`updated`=CURRENT_TIMESTAMP(6)",
        );
        self.flush().await
    }

    async fn commit(&mut self) -> Result<()> {
        self.flush().await?;
        self.conn
            .query_drop("COMMIT")
            .await
            .map_err(|e| fail(e, &self.display, &self.what()))?;
        self.sent = false;
        Ok(())
    }

    async fn rollback(&mut self) -> Result<()> {
        self.buf.clear();
        if !self.sent {
            return Ok(());
        }
        self.sent = false;
        self.conn
            .query_drop("ROLLBACK")
            .await
            .map_err(|e| fail(e, &self.display, "rolling back a unit on"))
    }
}
