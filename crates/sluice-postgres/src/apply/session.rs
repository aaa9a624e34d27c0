//! One apply worker's session: a unit's rows as SQL statements, sent in as few round trips as
//! possible.
//!
//! `begin`, `apply` and `record` only buffer text (`BEGIN`, then one statement per change,
//! consecutive inserts into one table merged into one multi-row `INSERT`, then the position
//! upsert); `send` sends the buffer as one simple-query message (statements separated by `;`,
//! the transaction left open by its `BEGIN`) and `commit` sends what is left with `COMMIT`. A
//! unit that is already next to commit is one round trip, whatever its size; one that waits
//! for its turn two; a buffer past [`FLUSH_BYTES`] is sent early.
//!
//! Values are SQL literals ([`super::render`]): unknown-typed constants that PostgreSQL reads
//! with the input function of the column they are assigned to or compared with, so a statement
//! needs no parameter types and many statements fit one message.

use super::render::{Kind, push_literal, push_sql};
use super::{ddl, failed, names};
use crate::sql::{quote_ident, quote_table};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, GenericListArray, StringArray};
use async_trait::async_trait;
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyUnit, Barrier, UnitTable};
use sluice_core::change::{ABSENT, OP};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};
use std::fmt::Write;
use tokio_postgres::{Client, SimpleQueryMessage};

/// Buffered statement text sent before the unit's end once it passes this size.
pub const FLUSH_BYTES: usize = 1 << 20;

/// Types without an equality operator: a keyless table's rows compare their text instead.
const NO_EQUALITY: [&str; 9] = [
    "json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle",
];

/// What a buffered statement is, to log updates and deletes that matched no row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stmt {
    Other,
    Insert,
    Update,
    Delete,
}

/// An apply session (see the module documentation).
pub struct PgSession {
    client: Client,
    display: String,
    name: String,
    worker: u32,
    buf: String,
    kinds: Vec<Stmt>,
    scratch: String,
    /// The multi-row insert being built: (table, absent mask) it is for.
    insert: Option<(TableRef, Vec<bool>)>,
    /// Tables the buffer touches (for messages).
    touched: Vec<TableRef>,
    /// Something of the transaction was sent (a rollback must be sent too).
    sent: bool,
}

/// A unit table's columns prepared for rendering.
struct Prepared<'a> {
    t: &'a UnitTable,
    table: String,
    names: Vec<String>,
    kinds: Vec<Kind>,
    text_compare: Vec<bool>,
    key: Vec<usize>,
    op: &'a StringArray,
    absent: &'a GenericListArray<i32>,
}

impl<'a> Prepared<'a> {
    /// `same_engine`: the columns have their source types on the target (a PostgreSQL source),
    /// so the types without equality are known by name.
    fn new(t: &'a UnitTable, same_engine: bool) -> Result<Self> {
        let n = t.columns.len();
        let column = |name: &str| -> Result<&'a ArrayRef> {
            let i = t.batch.schema().index_of(name).map_err(|_| {
                Error::internal(format!("rows of {} without change column {name}", t.table))
            })?;
            Ok(t.batch.column(i))
        };
        let op = column(OP)?
            .as_string_opt::<i32>()
            .ok_or_else(|| Error::internal("_op is not Utf8"))?;
        let absent = column(ABSENT)?
            .as_list_opt::<i32>()
            .ok_or_else(|| Error::internal("_absent is not a list"))?;
        let mut kinds = Vec::with_capacity(n);
        for (c, f) in t.columns.iter().zip(t.batch.schema().fields().iter()) {
            kinds
                .push(Kind::of(f).map_err(|e| {
                    Error::data(format!("{}.{}: {}", t.table, c.name, e.message()))
                })?);
        }
        let key = t.key_positions()?;
        Ok(Prepared {
            t,
            table: quote_table(&t.table),
            names: t.columns.iter().map(|c| quote_ident(&c.name)).collect(),
            kinds,
            text_compare: t
                .columns
                .iter()
                .map(|c| same_engine && NO_EQUALITY.contains(&c.source_type.trim_end_matches("[]")))
                .collect(),
            key,
            op,
            absent,
        })
    }

    /// The absent mask of row `r` (all false when the row carries every column).
    fn absent(&self, r: usize, mask: &mut Vec<bool>) {
        mask.clear();
        mask.resize(self.names.len(), false);
        if self.absent.is_null(r) || self.absent.value_length(r) == 0 {
            return;
        }
        let list = self.absent.value(r);
        let Some(names) = list.as_string_opt::<i32>() else {
            return;
        };
        for name in names.iter().flatten() {
            if let Some(i) = self.t.columns.iter().position(|c| c.name == name) {
                mask[i] = true;
            }
        }
    }
}

impl PgSession {
    /// A session over `client` (already set up) for worker `worker` of replication `name`.
    pub fn new(client: Client, display: String, name: &str, worker: u32) -> Self {
        PgSession {
            client,
            display,
            name: name.to_string(),
            worker,
            buf: String::new(),
            kinds: Vec::new(),
            scratch: String::new(),
            insert: None,
            touched: Vec::new(),
            sent: false,
        }
    }

    fn end_insert(&mut self) {
        if self.insert.take().is_some() {
            self.buf.push_str(";\n");
        }
    }

    fn touch(&mut self, t: &TableRef) {
        if !self.touched.contains(t) {
            self.touched.push(t.clone());
        }
    }

    /// Send the buffer (one message); the transaction stays open.
    async fn flush(&mut self) -> Result<()> {
        self.end_insert();
        if self.buf.is_empty() {
            return Ok(());
        }
        self.sent = true;
        let what = if self.touched.is_empty() {
            "applying changes".to_string()
        } else {
            format!("applying changes to {}", names(&self.touched))
        };
        let result = self.client.simple_query(&self.buf).await;
        self.buf.clear();
        let kinds = std::mem::take(&mut self.kinds);
        self.touched.clear();
        let msgs = result.map_err(|e| failed(e, &self.display, &what))?;
        if tracing::enabled!(tracing::Level::DEBUG) {
            let counts = msgs.iter().filter_map(|m| match m {
                SimpleQueryMessage::CommandComplete(n) => Some(*n),
                _ => None,
            });
            let missed = kinds
                .iter()
                .zip(counts)
                .filter(|(k, n)| matches!(k, Stmt::Update | Stmt::Delete) && *n == 0)
                .count();
            if missed > 0 {
                tracing::debug!(
                    "{missed} update(s) or delete(s) matched no row on the target while {what}"
                );
            }
        }
        Ok(())
    }

    /// `col = 'v'` (or `IS NULL`) for each of `cols` of row `r`, joined by `AND`.
    fn conditions(&mut self, p: &Prepared<'_>, cols: &[usize], r: usize) -> Result<()> {
        if cols.is_empty() {
            self.buf.push_str("true");
        }
        for (n, &c) in cols.iter().enumerate() {
            if n > 0 {
                self.buf.push_str(" AND ");
            }
            let a = p.t.batch.column(c).as_ref();
            if a.is_null(r) {
                let _ = write!(self.buf, "{} IS NULL", p.names[c]);
                continue;
            }
            if p.text_compare[c] {
                let _ = write!(self.buf, "{}::text = ", p.names[c]);
            } else {
                let _ = write!(self.buf, "{} = ", p.names[c]);
            }
            push_sql(&p.kinds[c], a, r, &mut self.scratch, &mut self.buf)?;
        }
        Ok(())
    }

    /// The `WHERE` of an update or delete of row `r`: the key, or for a keyless table the first
    /// row whose every sent column matches.
    fn matching(&mut self, p: &Prepared<'_>, r: usize, absent: &[bool]) -> Result<()> {
        if !p.key.is_empty() {
            self.buf.push_str(" WHERE ");
            return self.conditions(p, &p.key, r);
        }
        let cols: Vec<usize> = (0..p.names.len()).filter(|&i| !absent[i]).collect();
        let _ = write!(
            self.buf,
            " WHERE ctid = (SELECT ctid FROM {} WHERE ",
            p.table
        );
        self.conditions(p, &cols, r)?;
        self.buf.push_str(" LIMIT 1)");
        Ok(())
    }

    fn row(&mut self, p: &Prepared<'_>, r: usize, absent: &mut Vec<bool>) -> Result<()> {
        let op = p.op.value(r);
        p.absent(r, absent);
        match op {
            "insert" => {
                let same = matches!(&self.insert, Some((t, m)) if *t == p.t.table && m == absent);
                if absent.iter().all(|a| *a) {
                    self.end_insert();
                    let _ = writeln!(self.buf, "INSERT INTO {} DEFAULT VALUES;", p.table);
                    self.kinds.push(Stmt::Insert);
                    return Ok(());
                }
                if same {
                    self.buf.push_str(",\n(");
                } else {
                    self.end_insert();
                    let cols: Vec<&str> = (0..p.names.len())
                        .filter(|&i| !absent[i])
                        .map(|i| p.names[i].as_str())
                        .collect();
                    let _ = write!(
                        self.buf,
                        "INSERT INTO {} ({}) VALUES\n(",
                        p.table,
                        cols.join(", ")
                    );
                    self.kinds.push(Stmt::Insert);
                    self.insert = Some((p.t.table.clone(), absent.clone()));
                }
                let mut first = true;
                for c in (0..p.names.len()).filter(|&i| !absent[i]) {
                    if !first {
                        self.buf.push_str(", ");
                    }
                    first = false;
                    let a = p.t.batch.column(c).as_ref();
                    push_sql(&p.kinds[c], a, r, &mut self.scratch, &mut self.buf)?;
                }
                self.buf.push(')');
            }
            "update" => {
                self.end_insert();
                let set: Vec<usize> = (0..p.names.len())
                    .filter(|i| !absent[*i] && !p.key.contains(i))
                    .collect();
                if set.is_empty() {
                    return Ok(());
                }
                let _ = write!(self.buf, "UPDATE {} SET ", p.table);
                for (n, &c) in set.iter().enumerate() {
                    if n > 0 {
                        self.buf.push_str(", ");
                    }
                    let _ = write!(self.buf, "{} = ", p.names[c]);
                    let a = p.t.batch.column(c).as_ref();
                    push_sql(&p.kinds[c], a, r, &mut self.scratch, &mut self.buf)?;
                }
                self.matching(p, r, absent)?;
                self.buf.push_str(";\n");
                self.kinds.push(Stmt::Update);
            }
            "delete" => {
                self.end_insert();
                let _ = write!(self.buf, "DELETE FROM {}", p.table);
                self.matching(p, r, absent)?;
                self.buf.push_str(";\n");
                self.kinds.push(Stmt::Delete);
            }
            other => {
                return Err(Error::internal(format!(
                    "a change {other:?} of {} reached an apply unit",
                    p.t.table
                )));
            }
        }
        Ok(())
    }
}

#[async_trait]
impl ApplySession for PgSession {
    async fn begin(&mut self) -> Result<()> {
        self.buf.clear();
        self.kinds.clear();
        self.touched.clear();
        self.insert = None;
        self.sent = false;
        self.buf.push_str("BEGIN;\n");
        self.kinds.push(Stmt::Other);
        Ok(())
    }

    async fn apply(&mut self, unit: &ApplyUnit) -> Result<()> {
        let prepared = unit
            .tables
            .iter()
            .map(|t| Prepared::new(t, t.source_engine == "postgres"))
            .collect::<Result<Vec<_>>>()?;
        let mut absent = Vec::new();
        for &(t, r) in &unit.order {
            let p = prepared
                .get(t as usize)
                .ok_or_else(|| Error::internal("an apply unit's order names no table"))?;
            self.touch(&p.t.table);
            self.row(p, r as usize, &mut absent)?;
            if self.buf.len() > FLUSH_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn barrier(&mut self, barrier: &Barrier) -> Result<()> {
        self.flush().await?;
        match barrier {
            Barrier::Truncate(tables) => {
                if tables.is_empty() {
                    return Ok(());
                }
                self.buf.push_str(&ddl::truncate_sql(tables));
                self.kinds.push(Stmt::Other);
                self.touched.extend(tables.iter().cloned());
                self.flush().await
            }
            Barrier::Columns {
                table,
                columns,
                source_engine,
            } => {
                let same = *source_engine == "postgres";
                let (sql, notes) =
                    ddl::alter_sql(&self.client, table, columns, same, &self.display).await?;
                for n in notes {
                    tracing::info!("{n}");
                }
                if sql.is_empty() {
                    return Ok(());
                }
                self.buf.push_str(&sql);
                self.kinds.push(Stmt::Other);
                self.touch(table);
                self.flush().await
            }
        }
    }

    async fn record(&mut self, p: &AppliedPosition) -> Result<()> {
        self.end_insert();
        self.buf.push_str(
            "INSERT INTO sluice.applied (name, worker, unit, restart, pos, commit_ts) VALUES (",
        );
        push_literal(&self.name, &mut self.buf);
        let _ = write!(self.buf, ", {}, {}, ", self.worker, p.unit);
        push_literal(&p.restart, &mut self.buf);
        self.buf.push_str(", ");
        push_literal(&p.pos, &mut self.buf);
        match p.commit_ts {
            Some(ts) => {
                let _ = write!(self.buf, ", {ts})");
            }
            None => self.buf.push_str(", NULL)"),
        }
        self.buf.push_str(
            " ON CONFLICT (name, worker) DO UPDATE SET unit = excluded.unit, restart = \
             excluded.restart, pos = excluded.pos, commit_ts = excluded.commit_ts, \
             updated_at = now();\n",
        );
        self.kinds.push(Stmt::Other);
        Ok(())
    }

    async fn send(&mut self) -> Result<()> {
        self.flush().await
    }

    async fn commit(&mut self) -> Result<()> {
        self.end_insert();
        self.buf.push_str("COMMIT");
        self.kinds.push(Stmt::Other);
        self.flush().await?;
        self.sent = false;
        Ok(())
    }

    async fn rollback(&mut self) -> Result<()> {
        self.buf.clear();
        self.kinds.clear();
        self.touched.clear();
        self.insert = None;
        if !std::mem::take(&mut self.sent) {
            return Ok(());
        }
        self.client
            .batch_execute("ROLLBACK")
            .await
            .map_err(|e| failed(e, &self.display, "rolling back"))
    }
}
