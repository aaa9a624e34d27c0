//! One apply worker's session: a unit's rows as SQL text, sent in at most two round trips.
//!
//! `begin`, `apply` and `record` only write statements into a buffer (the last one the position
//! upsert); `send` sends the buffer as one multi-statement batch and `commit` sends what is left
//! with `COMMIT`: one round trip for a unit that is already next to commit, two for one that
//! waits for its turn. Consecutive inserts into one table with the same columns become
//! one multi-row `INSERT`, and a batch of updates or deletes (rows of one table sharing no
//! key, `ApplyUnit::batches`) one statement per set of columns carried (`batch.rs`). A buffer past [`FLUSH_BYTES`] is sent early, so memory stays bounded
//! for a large transaction.
//!
//! Statements: an insert names the columns the row carries; an update sets the non-key columns
//! the row carries (`_absent` ones keep their value) where the key columns equal the row's; a
//! delete matches the key. A table without a key matches every column the row carries with
//! `<=>` (NULL matches NULL) and touches at most one row (`LIMIT 1`). An update or delete that
//! matches no row changes nothing: the source said the row existed, so it is not an error.
//!
//! Length: about 560 lines of code plus unit tests of the SQL text (a unit's statements and a
//! batch's); the statement builder ([`Script`]) and the session that sends it share the buffer,
//! its bound and the expected row counts that tell an update or delete that matched nothing.

use super::batch::{self, DELETE_ROWS, Prepared, UPDATE_ROWS};
use super::fail;
use super::render::{self, Kind};
use crate::sql::quote_table;
use arrow_array::Array;
use async_trait::async_trait;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_core::apply::{AppliedPosition, ApplySession, ApplyUnit, Barrier, SourceColumn};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};

/// A buffer of statements past this many bytes is sent before the unit ends.
const FLUSH_BYTES: usize = 1 << 20;

/// An apply session (see the module documentation).
pub struct MySession {
    conn: Conn,
    display: String,
    name: String,
    worker: u32,
    /// The statements not sent yet.
    script: Script,
    /// Statements of the open transaction already sent (a rollback must reach the server).
    sent: bool,
    /// Tables of the open transaction, for messages.
    tables: Vec<String>,
    /// Updates and deletes of the open transaction that matched no row.
    missed: u64,
    /// The same for the last committed transaction.
    committed_missed: u64,
}

impl MySession {
    pub(super) fn new(
        conn: Conn,
        display: String,
        name: &str,
        worker: u32,
        mysql_json: bool,
    ) -> Self {
        MySession {
            conn,
            display,
            name: name.to_string(),
            worker,
            script: Script::new(mysql_json),
            sent: false,
            tables: Vec::new(),
            missed: 0,
            committed_missed: 0,
        }
    }

    fn what(&self) -> String {
        match self.tables.len() {
            0 => "applying a unit to".to_string(),
            _ => format!("applying a unit ({}) to", self.tables.join(", ")),
        }
    }

    async fn flush(&mut self) -> Result<()> {
        if self.script.buf.is_empty() {
            return Ok(());
        }
        let sql = std::mem::take(&mut self.script.buf);
        let expect = std::mem::take(&mut self.script.expect);
        self.sent = true;
        let r = counted(&mut self.conn, sql.as_str()).await;
        // Keep the allocation for the next unit.
        self.script.buf = sql;
        self.script.buf.clear();
        let counts = match r {
            Ok(c) => c,
            Err(e) => {
                let e = fail(e, &self.display, &self.what());
                if !e.is_apply_blocked() {
                    return Err(e);
                }
                // Name who holds the lock; the transaction is lost anyway.
                self.sent = false;
                let _ = self.conn.query_drop("ROLLBACK").await;
                let who = holders(&mut self.conn).await;
                return Err(Error::apply_blocked(format!("{} {who}", e.message())));
            }
        };
        if counts.len() != expect.len() {
            tracing::debug!(
                "{} statement results for {} statements sent",
                counts.len(),
                expect.len()
            );
        }
        let missed: u64 = expect
            .iter()
            .zip(&counts)
            .filter_map(|(want, got)| want.map(|w| w.saturating_sub(*got)))
            .sum();
        self.missed += missed;
        Ok(())
    }

    /// A batch of updates or deletes of a keyed table (rows sharing no key): one statement per
    /// set of columns carried and per [`UPDATE_ROWS`] / [`DELETE_ROWS`] rows.
    async fn many(&mut self, p: &Prepared<'_>, op: &str, rows: &[(u32, u32)]) -> Result<()> {
        let mut groups: Vec<(Vec<bool>, Vec<usize>)> = Vec::new();
        for &(_, r) in rows {
            let r = r as usize;
            let present = if op == "update" {
                p.present(r)
            } else {
                Vec::new()
            };
            match groups.iter_mut().find(|(m, _)| *m == present) {
                Some((_, g)) => g.push(r),
                None => groups.push((present, vec![r])),
            }
        }
        for (present, group) in &groups {
            let size = if op == "update" {
                UPDATE_ROWS
            } else {
                DELETE_ROWS
            };
            for chunk in group.chunks(size) {
                let n = chunk.len() as u64;
                if op == "update" {
                    if batch::update(p, chunk, present, &mut self.script.buf)? {
                        self.script.expect.push(Some(n));
                    }
                } else {
                    batch::delete(p, chunk, &mut self.script.buf)?;
                    self.script.expect.push(Some(n));
                }
                if self.script.buf.len() > FLUSH_BYTES {
                    self.flush().await?;
                }
            }
        }
        Ok(())
    }
}

/// Run `sql` (statements separated by `;`) and return each statement's affected rows, in
/// order: with the session's `CLIENT_FOUND_ROWS`, the rows an update matched.
///
/// The server stops at the first statement that fails; its error is what this returns
/// (reading on past the last result set, as `drop_result` does, is what surfaces it).
async fn counted(conn: &mut Conn, sql: &str) -> mysql_async::Result<Vec<u64>> {
    let mut result = conn.query_iter(sql).await?;
    let mut counts = vec![result.affected_rows()];
    while !result.is_empty() {
        if result.next().await?.is_some() {
            continue;
        }
        counts.push(result.affected_rows());
    }
    result.drop_result().await?;
    Ok(counts)
}

/// Sessions in open transactions on the target (who may hold the lock a statement gave up
/// waiting for), for the message.
async fn holders(conn: &mut Conn) -> String {
    /// Connection id, user, host, seconds in its state, statement.
    type Holder = (u64, String, String, u64, String);
    let rows: std::result::Result<Vec<Holder>, _> = conn
        .query(
            "SELECT p.ID, p.USER, p.HOST, p.TIME, LEFT(COALESCE(p.INFO, ''), 80) \
             FROM information_schema.INNODB_TRX t \
             JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
             WHERE p.ID <> CONNECTION_ID() ORDER BY t.trx_started",
        )
        .await;
    match rows {
        Ok(rows) if !rows.is_empty() => {
            let list: Vec<String> = rows
                .iter()
                .map(|(id, user, host, time, info)| {
                    format!("id {id} ({user}@{host}, {time} s in its state, {info:?})")
                })
                .collect();
            format!("Sessions with open transactions: {}.", list.join("; "))
        }
        _ => "Another session holds the lock (SHOW PROCESSLIST lists it).".into(),
    }
}

/// The SQL text of units, built without a connection.
struct Script {
    buf: String,
    /// MySQL (not MariaDB): JSON columns compare with `CAST(… AS JSON)`.
    mysql_json: bool,
    /// The insert being extended: (table, the columns its rows carry).
    open: Option<(u32, Vec<bool>)>,
    /// Per statement of `buf`, the rows an update or delete should match (`None` for the
    /// others), to count those that matched none.
    expect: Vec<Option<u64>>,
}

impl Script {
    fn new(mysql_json: bool) -> Self {
        Script {
            buf: String::new(),
            mysql_json,
            open: None,
            expect: Vec::new(),
        }
    }

    /// End the insert being extended, if any.
    fn close(&mut self) {
        if self.open.take().is_some() {
            self.buf.push(';');
            self.expect.push(None);
        }
    }

    /// A statement that is no update or delete of a row (`sql` ends with `;`, or is the
    /// buffer's last).
    fn other(&mut self, sql: &str) {
        self.buf.push_str(sql);
        self.expect.push(None);
    }

    /// Row `r` of table `ti` (prepared as `p`): a statement, or one more row of the insert
    /// being extended.
    fn row(&mut self, p: &Prepared<'_>, ti: u32, r: usize) -> Result<()> {
        let present = p.present(r);
        let op = p.op.value(r);
        if op == "insert" {
            if matches!(&self.open, Some((t, cols)) if *t == ti && *cols == present) {
                self.buf.push(',');
            } else {
                self.close();
                self.buf.push_str("INSERT INTO ");
                self.buf.push_str(&p.name);
                self.buf.push_str(" (");
                let mut first = true;
                for ((n, _, _), keep) in p.cols.iter().zip(&present) {
                    if *keep {
                        if !first {
                            self.buf.push(',');
                        }
                        first = false;
                        self.buf.push_str(n);
                    }
                }
                self.buf.push_str(") VALUES ");
                self.open = Some((ti, present.clone()));
            }
            return self.push_row(p, r, &present);
        }
        self.close();
        match op {
            "update" => {
                let set: Vec<usize> = (0..p.cols.len())
                    .filter(|i| present[*i] && !p.key.contains(i))
                    .collect();
                if set.is_empty() {
                    return Ok(());
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
                self.push_where(p, r, &present)
            }
            "delete" => {
                self.buf.push_str("DELETE FROM ");
                self.buf.push_str(&p.name);
                self.push_where(p, r, &present)
            }
            other => Err(Error::internal(format!(
                "a unit holds a {other:?} change of {}; only insert, update and delete are \
                 applied in units",
                p.t.table
            ))),
        }
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
        self.expect.push(Some(1));
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
        self.script.buf.clear();
        self.script.expect.clear();
        self.tables.clear();
        self.sent = false;
        self.missed = 0;
        self.script.other("START TRANSACTION;");
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
        for range in unit.batch_ranges() {
            let rows = &unit.order[range];
            let Some(&(ti, first)) = rows.first() else {
                continue;
            };
            let p = prepared.get(ti as usize).ok_or_else(|| {
                Error::internal(format!("unit order names table {ti}, which it lacks"))
            })?;
            let op = p.op.value(first as usize);
            if rows.len() > 1 && !p.key.is_empty() && (op == "update" || op == "delete") {
                self.script.close();
                self.many(p, op, rows).await?;
                continue;
            }
            // A batch's inserts grouped by the columns they carry: each group extends one
            // multi-row INSERT (rows of a batch may go in any order).
            let mut ordered: Vec<usize> = rows.iter().map(|(_, r)| *r as usize).collect();
            if op == "insert" && rows.len() > 1 {
                ordered.sort_by_cached_key(|r| p.present(*r));
            }
            for r in ordered {
                self.script.row(p, ti, r)?;
                if self.script.buf.len() > FLUSH_BYTES {
                    self.script.close();
                    self.flush().await?;
                }
            }
        }
        self.script.close();
        Ok(())
    }

    /// DDL commits by itself on MySQL/MariaDB: what the transaction holds is committed first
    /// together with `before`, so a crash between here and the unit's end restarts exactly
    /// after the changes already applied (and applies the barrier again: it is idempotent).
    async fn barrier(&mut self, barrier: &Barrier, before: &AppliedPosition) -> Result<bool> {
        self.script.close();
        self.record(before).await?;
        self.script.other("COMMIT");
        self.flush().await?;
        self.sent = false;
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
            Barrier::Columns {
                table,
                before,
                columns,
                source_engine,
            } => {
                let have = super::columns_of(&mut self.conn, table, &self.display).await?;
                if have.is_empty() {
                    return Err(Error::config(format!(
                        "the target table {table} is missing on {}; drop the replication's \
                         state and start again with an initial load",
                        self.display
                    )));
                }
                if let Some(sql) = super::ddl::alter_columns(
                    table,
                    &have,
                    before,
                    columns,
                    *source_engine == "mysql",
                ) {
                    self.conn
                        .query_drop(sql)
                        .await
                        .map_err(|e| fail(e, &self.display, &format!("altering {table} on")))?;
                }
            }
        }
        // The DDL committed; what follows runs in a transaction of its own.
        self.script.other("START TRANSACTION;");
        Ok(true)
    }

    async fn record(&mut self, position: &AppliedPosition) -> Result<()> {
        use std::fmt::Write;
        let _ = write!(
            self.script.buf,
            "INSERT INTO `sluice`.`applied` (`name`,`worker`,`unit`,`restart`,`pos`,\
             `commit_ts`,`skip`) VALUES ("
        );
        render::push_text(&mut self.script.buf, &self.name);
        let _ = write!(self.script.buf, ",{},{},", self.worker, position.unit);
        render::push_text(&mut self.script.buf, &position.restart);
        self.script.buf.push(',');
        render::push_text(&mut self.script.buf, &position.pos);
        match position.commit_ts {
            Some(ts) => {
                let _ = write!(self.script.buf, ",{ts}");
            }
            None => self.script.buf.push_str(",NULL"),
        }
        let _ = write!(self.script.buf, ",{})", position.skip);
        self.script.other(
            " ON DUPLICATE KEY UPDATE `unit`=VALUES(`unit`),`restart`=VALUES(`restart`),\
             `pos`=VALUES(`pos`),`commit_ts`=VALUES(`commit_ts`),`skip`=VALUES(`skip`),\
             `updated`=CURRENT_TIMESTAMP(6);",
        );
        Ok(())
    }

    async fn send(&mut self) -> Result<()> {
        self.script.close();
        self.flush().await
    }

    async fn commit(&mut self) -> Result<()> {
        self.script.close();
        self.script.other("COMMIT");
        self.flush().await?;
        self.sent = false;
        self.committed_missed = std::mem::take(&mut self.missed);
        Ok(())
    }

    fn unmatched(&self) -> u64 {
        self.committed_missed
    }

    async fn columns(&mut self, table: &TableRef, columns: &[SourceColumn]) -> Result<()> {
        self.script.close();
        self.script.buf.push_str(
            "INSERT INTO `sluice`.`columns` (`name`,`table_schema`,`table_name`,`columns`) \
             VALUES (",
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
                self.script.buf.push(',');
            }
            render::push_text(&mut self.script.buf, v);
        }
        self.script.other(
            ") ON DUPLICATE KEY UPDATE `columns`=VALUES(`columns`),\
             `updated`=CURRENT_TIMESTAMP(6);",
        );
        Ok(())
    }

    async fn rollback(&mut self) -> Result<()> {
        self.script.buf.clear();
        self.script.expect.clear();
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::{
        Int32Array, RecordBatch, StringArray, TimestampMicrosecondArray, UInt64Array,
    };
    use arrow_schema::DataType;
    use sluice_core::apply::UnitTable;
    use sluice_core::change::change_schema;
    use sluice_core::columns::field;
    use sluice_core::table::{ColumnDesc, TableRef};
    use std::sync::Arc;

    /// Table `d.t (id int, v text)`: rows of (op, id, v, absent columns).
    fn table(key: &[&str], rows: &[(&str, i32, Option<&str>, &[&str])]) -> UnitTable {
        let t = TableRef {
            schema: "d".into(),
            name: "t".into(),
        };
        let cols: Vec<ColumnDesc> = [("id", DataType::Int32), ("v", DataType::Utf8)]
            .into_iter()
            .map(|(n, dt)| ColumnDesc {
                name: n.into(),
                source_type: "x".into(),
                field: field(n, dt),
                cast: None,
                as_text_fallback: false,
            })
            .collect();
        let n = rows.len();
        let mut absent = ListBuilder::new(StringBuilder::new());
        for r in rows {
            for a in r.3 {
                absent.values().append_value(a);
            }
            absent.append(true);
        }
        let batch = RecordBatch::try_new(
            change_schema(&t, &cols).unwrap(),
            vec![
                Arc::new(Int32Array::from(
                    rows.iter().map(|r| r.1).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.2).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(
                    rows.iter().map(|r| r.0).collect::<Vec<_>>(),
                )),
                Arc::new(StringArray::from(vec!["p"; n])),
                Arc::new(UInt64Array::from((0..n as u64).collect::<Vec<_>>())),
                Arc::new(TimestampMicrosecondArray::from(vec![None; n]).with_timezone("UTC")),
                Arc::new(StringArray::from(vec![None::<&str>; n])),
                Arc::new(absent.finish()),
            ],
        )
        .unwrap();
        UnitTable {
            table: t,
            columns: Arc::new(cols),
            key: Arc::new(key.iter().map(|k| k.to_string()).collect()),
            batch,
            source_engine: "mysql",
            sole_key: false,
        }
    }

    fn script(t: &UnitTable) -> String {
        let p = Prepared::new(t).unwrap();
        let mut s = Script::new(false);
        for r in 0..t.batch.num_rows() {
            s.row(&p, 0, r).unwrap();
        }
        s.close();
        s.buf
    }

    #[test]
    fn a_unit_as_statements() {
        let x = |s: &str| crate::sql::quote_literal(s);
        let t = table(
            &["id"],
            &[
                ("insert", 1, Some("a"), &[]),
                ("insert", 2, None, &[]),
                ("update", 1, None, &["v"]),
                ("update", 2, Some("b"), &[]),
                ("insert", 3, None, &["v"]),
                ("delete", 1, None, &["v"]),
            ],
        );
        assert_eq!(
            script(&t),
            format!(
                "INSERT INTO `d`.`t` (`id`,`v`) VALUES (1,{}),(2,NULL);\
                 UPDATE `d`.`t` SET `v`={} WHERE `id` = 2;\
                 INSERT INTO `d`.`t` (`id`) VALUES (3);\
                 DELETE FROM `d`.`t` WHERE `id` = 1;",
                x("a"),
                x("b")
            ),
            "consecutive inserts with the same columns share a statement; an update of \
             absent columns only has nothing to set"
        );
        let keyless = table(
            &[],
            &[("delete", 1, None, &[]), ("update", 2, Some("b"), &[])],
        );
        assert_eq!(
            script(&keyless),
            format!(
                "DELETE FROM `d`.`t` WHERE `id` <=> 1 AND `v` IS NULL LIMIT 1;\
                 UPDATE `d`.`t` SET `id`=2,`v`={b} WHERE `id` <=> 2 AND `v` <=> {b} LIMIT 1;",
                b = x("b")
            )
        );
    }

    #[test]
    fn a_batch_as_statements() {
        let x = |s: &str| crate::sql::quote_literal(s);
        let t = table(
            &["id"],
            &[
                ("update", 1, Some("a"), &[]),
                ("update", 2, None, &[]),
                ("delete", 3, None, &["v"]),
                ("delete", 4, None, &["v"]),
            ],
        );
        let p = Prepared::new(&t).unwrap();
        let mut buf = String::new();
        assert!(batch::update(&p, &[0, 1], &[true, true], &mut buf).unwrap());
        batch::delete(&p, &[2, 3], &mut buf).unwrap();
        assert_eq!(
            buf,
            format!(
                "UPDATE `d`.`t` SET `v`=CASE WHEN (`id` = 1) THEN {} WHEN (`id` = 2) THEN NULL END \
                 WHERE `id` IN (1,2);DELETE FROM `d`.`t` WHERE `id` IN (3,4);",
                x("a")
            )
        );
        buf.clear();
        assert!(
            !batch::update(&p, &[0], &[true, false], &mut buf).unwrap(),
            "only the key present: nothing to set"
        );
        let two = table(
            &["id", "v"],
            &[("delete", 1, Some("a"), &[]), ("delete", 2, Some("b"), &[])],
        );
        let p = Prepared::new(&two).unwrap();
        batch::delete(&p, &[0, 1], &mut buf).unwrap();
        assert_eq!(
            buf,
            format!(
                "DELETE FROM `d`.`t` WHERE (`id` = 1 AND `v` = {}) OR (`id` = 2 AND `v` = {});",
                x("a"),
                x("b")
            )
        );
    }
}
