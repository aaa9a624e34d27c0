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
//!
//! Length: about 530 lines: the buffered statements, their row counts (unmatched updates and
//! deletes) and the lock-wait handling share the session's buffer and state.

use super::batch::{self, Prepared, STATEMENT_ROWS};
use super::render::{push_literal, push_sql};
use super::{ddl, failed, names};
use async_trait::async_trait;
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyUnit, Barrier, SourceColumn};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};
use std::fmt::Write;
use tokio_postgres::{Client, SimpleQueryMessage};

/// Buffered statement text sent before the unit's end once it passes this size.
pub const FLUSH_BYTES: usize = 1 << 20;

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
    /// What each buffered statement is, with the rows an update or delete should match.
    kinds: Vec<(Stmt, u64)>,
    scratch: String,
    /// The multi-row insert being built: (table, absent mask) it is for.
    insert: Option<(TableRef, Vec<bool>)>,
    /// Tables the buffer touches (for messages).
    touched: Vec<TableRef>,
    /// Something of the transaction was sent (a rollback must be sent too).
    sent: bool,
    /// Updates and deletes of the open transaction that matched no row.
    missed: u64,
    /// The same for the last committed transaction.
    committed_missed: u64,
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
            missed: 0,
            committed_missed: 0,
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
        let touched = std::mem::take(&mut self.touched);
        let msgs = match result {
            Ok(m) => m,
            Err(e) => {
                let e = failed(e, &self.display, &what);
                if !e.is_apply_blocked() {
                    return Err(e);
                }
                // Name who holds the lock; the transaction is lost anyway.
                self.sent = false;
                let _ = self.client.batch_execute("ROLLBACK").await;
                let who = holders(&self.client, &touched).await;
                return Err(Error::apply_blocked(format!("{} {who}", e.message())));
            }
        };
        let counts = msgs.iter().filter_map(|m| match m {
            SimpleQueryMessage::CommandComplete(n) => Some(*n),
            _ => None,
        });
        let missed: u64 = kinds
            .iter()
            .zip(counts)
            .filter(|((k, _), _)| matches!(k, Stmt::Update | Stmt::Delete))
            .map(|((_, want), got)| want.saturating_sub(got))
            .sum();
        if missed > 0 {
            self.missed += missed;
            tracing::debug!(
                "{missed} update(s) or delete(s) matched no row on the target while {what}"
            );
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

    /// A batch of updates or deletes of a keyed table (rows sharing no key): one statement
    /// per set of columns carried and per [`STATEMENT_ROWS`] rows.
    async fn many(&mut self, p: &Prepared<'_>, op: &str, rows: &[(u32, u32)]) -> Result<()> {
        self.end_insert();
        let mut groups: Vec<(Vec<bool>, Vec<usize>)> = Vec::new();
        let mut mask = Vec::new();
        for &(_, r) in rows {
            let r = r as usize;
            if op == "update" {
                p.absent(r, &mut mask);
            }
            match groups.iter_mut().find(|(m, _)| *m == mask) {
                Some((_, g)) => g.push(r),
                None => groups.push((mask.clone(), vec![r])),
            }
        }
        for (mask, group) in &groups {
            for chunk in group.chunks(STATEMENT_ROWS) {
                let n = chunk.len() as u64;
                if op == "update" {
                    if batch::update(p, chunk, mask, &mut self.scratch, &mut self.buf)? {
                        self.kinds.push((Stmt::Update, n));
                    }
                } else {
                    batch::delete(p, chunk, &mut self.scratch, &mut self.buf)?;
                    self.kinds.push((Stmt::Delete, n));
                }
                if self.buf.len() > FLUSH_BYTES {
                    self.flush().await?;
                }
            }
        }
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
                    self.kinds.push((Stmt::Insert, 0));
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
                    self.kinds.push((Stmt::Insert, 0));
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
                self.kinds.push((Stmt::Update, 1));
            }
            "delete" => {
                self.end_insert();
                let _ = write!(self.buf, "DELETE FROM {}", p.table);
                self.matching(p, r, absent)?;
                self.buf.push_str(";\n");
                self.kinds.push((Stmt::Delete, 1));
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
        self.missed = 0;
        self.buf.push_str("BEGIN;\n");
        self.kinds.push((Stmt::Other, 0));
        Ok(())
    }

    async fn apply(&mut self, unit: &ApplyUnit) -> Result<()> {
        let prepared = unit
            .tables
            .iter()
            .map(|t| Prepared::new(t, t.source_engine == "postgres"))
            .collect::<Result<Vec<_>>>()?;
        let mut absent = Vec::new();
        for range in unit.batch_ranges() {
            let rows = &unit.order[range];
            let Some(&(t, first)) = rows.first() else {
                continue;
            };
            let p = prepared
                .get(t as usize)
                .ok_or_else(|| Error::internal("an apply unit's order names no table"))?;
            self.touch(&p.t.table);
            let op = p.op.value(first as usize);
            if rows.len() > 1 && !p.key.is_empty() && (op == "update" || op == "delete") {
                self.many(p, op, rows).await?;
                continue;
            }
            // Inserts of a batch grouped by the columns they carry, so each group is one
            // multi-row INSERT (rows of a batch may go in any order).
            let mut ordered: Vec<u32> = rows.iter().map(|(_, r)| *r).collect();
            if op == "insert" && rows.len() > 1 {
                let mut masks: Vec<Vec<bool>> = Vec::new();
                let mut group: Vec<usize> = Vec::with_capacity(rows.len());
                for &r in &ordered {
                    p.absent(r as usize, &mut absent);
                    let g = match masks.iter().position(|m| *m == absent) {
                        Some(g) => g,
                        None => {
                            masks.push(absent.clone());
                            masks.len() - 1
                        }
                    };
                    group.push(g);
                }
                if masks.len() > 1 {
                    let mut keyed: Vec<(usize, u32)> = group.into_iter().zip(ordered).collect();
                    keyed.sort_by_key(|(g, _)| *g);
                    ordered = keyed.into_iter().map(|(_, r)| r).collect();
                }
            }
            for r in ordered {
                self.row(p, r as usize, &mut absent)?;
                if self.buf.len() > FLUSH_BYTES {
                    self.flush().await?;
                }
            }
        }
        Ok(())
    }

    /// DDL is transactional here: the barrier runs inside the unit's transaction and nothing
    /// commits early (`before` is not needed).
    async fn barrier(&mut self, barrier: &Barrier, _before: &AppliedPosition) -> Result<bool> {
        self.flush().await?;
        match barrier {
            Barrier::Truncate(tables) => {
                if tables.is_empty() {
                    return Ok(false);
                }
                self.buf.push_str(&ddl::truncate_sql(tables));
                self.kinds.push((Stmt::Other, 0));
                self.touched.extend(tables.iter().cloned());
                self.flush().await?;
            }
            Barrier::Columns {
                table,
                before,
                columns,
                source_engine,
            } => {
                let same = *source_engine == "postgres";
                let (sql, notes) =
                    ddl::alter_sql(&self.client, table, before, columns, same, &self.display)
                        .await?;
                for n in notes {
                    tracing::info!("{n}");
                }
                if sql.is_empty() {
                    return Ok(false);
                }
                self.buf.push_str(&sql);
                self.kinds.push((Stmt::Other, 0));
                self.touch(table);
                self.flush().await?;
            }
        }
        Ok(false)
    }

    async fn record(&mut self, p: &AppliedPosition) -> Result<()> {
        self.end_insert();
        self.buf.push_str(
            "INSERT INTO sluice.applied (name, worker, unit, restart, pos, commit_ts, skip) \
             VALUES (",
        );
        push_literal(&self.name, &mut self.buf);
        let _ = write!(self.buf, ", {}, {}, ", self.worker, p.unit);
        push_literal(&p.restart, &mut self.buf);
        self.buf.push_str(", ");
        push_literal(&p.pos, &mut self.buf);
        match p.commit_ts {
            Some(ts) => {
                let _ = write!(self.buf, ", {ts}");
            }
            None => self.buf.push_str(", NULL"),
        }
        let _ = write!(self.buf, ", {})", p.skip);
        self.buf.push_str(
            " ON CONFLICT (name, worker) DO UPDATE SET unit = excluded.unit, restart = \
             excluded.restart, pos = excluded.pos, commit_ts = excluded.commit_ts, \
             skip = excluded.skip, updated_at = now();\n",
        );
        self.kinds.push((Stmt::Other, 0));
        Ok(())
    }

    async fn send(&mut self) -> Result<()> {
        self.flush().await
    }

    async fn commit(&mut self) -> Result<()> {
        self.end_insert();
        self.buf.push_str("COMMIT");
        self.kinds.push((Stmt::Other, 0));
        self.flush().await?;
        self.sent = false;
        self.committed_missed = std::mem::take(&mut self.missed);
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

    fn unmatched(&self) -> u64 {
        self.committed_missed
    }

    async fn columns(&mut self, table: &TableRef, columns: &[SourceColumn]) -> Result<()> {
        self.end_insert();
        self.buf.push_str(
            "INSERT INTO sluice.columns (name, table_schema, table_name, columns) VALUES (",
        );
        for (i, v) in [
            self.name.as_str(),
            table.schema.as_str(),
            table.name.as_str(),
            super::bookkeeping::columns_json(columns).as_str(),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                self.buf.push_str(", ");
            }
            push_literal(v, &mut self.buf);
        }
        self.buf.push_str(
            ") ON CONFLICT (name, table_schema, table_name) DO UPDATE SET columns = \
             excluded.columns, updated_at = now();\n",
        );
        self.kinds.push((Stmt::Other, 0));
        Ok(())
    }
}

/// Who holds locks on `tables` on the target (other sessions, with what they run and since
/// when), for the message of a lock wait that was given up.
async fn holders(client: &Client, tables: &[TableRef]) -> String {
    let names: Vec<String> = tables.iter().map(crate::sql::quote_table).collect();
    let rows = client
        .query(
            "SELECT DISTINCT a.pid::text, coalesce(a.usename::text, ''), \
               coalesce(a.application_name, ''), coalesce(a.state, ''), \
               coalesce(to_char(now() - a.xact_start, 'HH24:MI:SS'), ''), \
               left(coalesce(a.query, ''), 80) \
             FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.granted AND l.pid <> pg_backend_pid() \
               AND l.relation = ANY (SELECT to_regclass(t)::oid FROM unnest($1::text[]) t)",
            &[&names],
        )
        .await;
    match rows {
        Ok(rows) if !rows.is_empty() => {
            let list: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "pid {} (user {}, application {:?}, {}, transaction open {}, last \
                         statement {:?})",
                        r.get::<_, String>(0),
                        r.get::<_, String>(1),
                        r.get::<_, String>(2),
                        r.get::<_, String>(3),
                        r.get::<_, String>(4),
                        r.get::<_, String>(5)
                    )
                })
                .collect();
            format!("Sessions holding locks on it: {}.", list.join("; "))
        }
        _ => "Another session holds the lock (pg_locks lists it while it waits).".into(),
    }
}
