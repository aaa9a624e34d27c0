//! MySQL/MariaDB's spelling of the apply statements ([`sluice_core::apply::planner`] decides
//! which statements a unit becomes; this file only writes them), values as the literals of
//! [`super::render`].
//!
//! - inserts: a multi-row `INSERT … VALUES`; a row carrying no column is `()` (MySQL takes an
//!   empty column list, so it joins the multi-row insert like any other);
//! - a single-row update sets the non-key columns the row carries (`_absent` ones keep their
//!   value) where the key columns equal the row's (`IS NULL` for a NULL key value); a delete
//!   matches the key. A table without a key matches every column the row carries with `<=>`
//!   (NULL matches NULL) and touches at most one row (`LIMIT 1`). A geometry compares its WKB
//!   (`ST_AsBinary`), JSON on MySQL as JSON (`CAST(… AS JSON)`: MySQL's JSON type does not
//!   compare with text);
//! - a batch of updates or deletes by key: `UPDATE … SET c = CASE … END WHERE key IN (…)` and
//!   `DELETE … WHERE key IN (…)`.
//!
//! Why `CASE` and not a join with a derived table of the values (measured a little faster on
//! MariaDB): every comparison stays a column against a literal, as in a one-row statement, so
//! the column's collation decides it; a derived table's text columns carry a collation of
//! their own, which MySQL may refuse to mix with the column's. `CASE` is linear in the rows
//! of the statement for every row it updates, so an update statement holds at most 200 rows
//! ([`ApplyDialect::UPDATE_ROWS`]). The rows of a batch share no key, so no row is matched twice.

use super::render::{self, Kind};
use crate::sql::{quote_ident, quote_table};
use arrow_array::Array;
use sluice_core::Result;
use sluice_core::apply::planner::{ApplyDialect, Prepared};
use sluice_core::apply::{AppliedPosition, UnitTable};
use sluice_core::table::TableRef;
use std::fmt::Write;

/// MySQL/MariaDB's apply statements.
pub(super) struct MySql {
    /// MySQL (not MariaDB): JSON columns compare with `CAST(… AS JSON)`.
    pub(super) mysql_json: bool,
}

/// A unit table's columns as statements name and write them.
pub(super) struct Columns {
    table: String,
    /// Per column: its quoted name and how its values are written.
    cols: Vec<(String, Kind)>,
}

type P<'a> = Prepared<'a, Columns>;

/// Row `r`'s value of column `c` as a literal.
fn value(p: &P<'_>, kind: Kind, c: usize, r: usize, buf: &mut String) -> Result<()> {
    render::value(buf, kind, p.t.batch.column(c), r, &p.t.columns[c].name)
}

/// The condition that row `r` of `p` matches by its key: `(k1 = v1 AND k2 = v2)`.
fn key_match(p: &P<'_>, r: usize, buf: &mut String) -> Result<()> {
    buf.push('(');
    for (n, &k) in p.key.iter().enumerate() {
        if n > 0 {
            buf.push_str(" AND ");
        }
        let (name, kind) = &p.cols.cols[k];
        let _ = write!(buf, "{name} = ");
        value(p, *kind, k, r, buf)?;
    }
    buf.push(')');
    Ok(())
}

/// ` WHERE k IN (v1, v2, …)`, or `(k1 = … AND k2 = …) OR …` for a composite key.
fn key_where(p: &P<'_>, rows: &[usize], buf: &mut String) -> Result<()> {
    buf.push_str(" WHERE ");
    if let [k] = p.key[..] {
        let (name, kind) = &p.cols.cols[k];
        let _ = write!(buf, "{name} IN (");
        for (n, &r) in rows.iter().enumerate() {
            if n > 0 {
                buf.push(',');
            }
            value(p, *kind, k, r, buf)?;
        }
        buf.push(')');
        return Ok(());
    }
    for (n, &r) in rows.iter().enumerate() {
        if n > 0 {
            buf.push_str(" OR ");
        }
        key_match(p, r, buf)?;
    }
    Ok(())
}

impl ApplyDialect for MySql {
    type Columns = Columns;

    const UPDATE_ROWS: usize = 200;
    const DELETE_ROWS: usize = 1000;
    const END: &'static str = ";";
    const ROW_SEP: &'static str = ",";
    const BEGIN: &'static str = "START TRANSACTION";
    const COMMIT: &'static str = "COMMIT";
    const LIST_SEP: &'static str = ",";
    const VALUES_SEP: &'static str = " ";

    fn columns(&self, t: &UnitTable) -> Result<Columns> {
        Ok(Columns {
            table: quote_table(&t.table),
            cols: t
                .columns
                .iter()
                .map(|c| (quote_ident(&c.name), Kind::of(&c.field)))
                .collect(),
        })
    }

    fn table<'a>(p: &'a P<'_>) -> &'a str {
        &p.cols.table
    }

    fn name<'a>(p: &'a P<'_>, c: usize) -> &'a str {
        &p.cols.cols[c].0
    }

    fn value(&mut self, p: &P<'_>, c: usize, r: usize, buf: &mut String) -> Result<()> {
        value(p, p.cols.cols[c].1, c, r, buf)
    }

    fn default_values(&mut self, _p: &P<'_>) -> Option<String> {
        None
    }

    fn update_head(&mut self, p: &P<'_>, set: &[usize], r: usize, buf: &mut String) -> Result<()> {
        let _ = write!(buf, "UPDATE {} SET ", p.cols.table);
        for (n, &c) in set.iter().enumerate() {
            if n > 0 {
                buf.push(',');
            }
            let (name, kind) = &p.cols.cols[c];
            let _ = write!(buf, "{name}=");
            value(p, *kind, c, r, buf)?;
        }
        Ok(())
    }

    fn delete_head(&mut self, p: &P<'_>, buf: &mut String) {
        let _ = write!(buf, "DELETE FROM {}", p.cols.table);
    }

    fn row_where(&mut self, p: &P<'_>, cols: &[usize], r: usize, buf: &mut String) -> Result<()> {
        let keyless = p.key.is_empty();
        buf.push_str(" WHERE ");
        for (n, &c) in cols.iter().enumerate() {
            if n > 0 {
                buf.push_str(" AND ");
            }
            let (name, kind) = &p.cols.cols[c];
            if *kind == Kind::Wkb {
                let _ = write!(buf, "ST_AsBinary({name}) <=> ");
                value(p, Kind::Plain, c, r, buf)?;
                continue;
            }
            buf.push_str(name);
            if p.t.batch.column(c).is_null(r) {
                buf.push_str(" IS NULL");
                continue;
            }
            buf.push_str(if keyless { " <=> " } else { " = " });
            let json = *kind == Kind::Json && self.mysql_json;
            if json {
                buf.push_str("CAST(");
            }
            value(p, *kind, c, r, buf)?;
            if json {
                buf.push_str(" AS JSON)");
            }
        }
        if keyless {
            buf.push_str(" LIMIT 1");
        }
        Ok(())
    }

    fn update_many(
        &mut self,
        p: &P<'_>,
        set: &[usize],
        rows: &[usize],
        buf: &mut String,
    ) -> Result<()> {
        let _ = write!(buf, "UPDATE {} SET ", p.cols.table);
        for (n, &c) in set.iter().enumerate() {
            if n > 0 {
                buf.push(',');
            }
            let (name, kind) = &p.cols.cols[c];
            let _ = write!(buf, "{name}=CASE");
            for &r in rows {
                buf.push_str(" WHEN ");
                key_match(p, r, buf)?;
                buf.push_str(" THEN ");
                value(p, *kind, c, r, buf)?;
            }
            buf.push_str(" END");
        }
        key_where(p, rows, buf)
    }

    fn delete_many(&mut self, p: &P<'_>, rows: &[usize], buf: &mut String) -> Result<()> {
        let _ = write!(buf, "DELETE FROM {}", p.cols.table);
        key_where(p, rows, buf)
    }

    fn position(&mut self, name: &str, worker: u32, p: &AppliedPosition, buf: &mut String) {
        buf.push_str(
            "INSERT INTO `sluice`.`applied` (`name`,`worker`,`unit`,`restart`,`pos`,\
             `commit_ts`,`skip`) VALUES (",
        );
        render::push_text(buf, name);
        let _ = write!(buf, ",{worker},{},", p.unit);
        render::push_text(buf, p.restart.as_str());
        buf.push(',');
        render::push_text(buf, p.pos.as_str());
        match p.commit_ts {
            Some(ts) => {
                let _ = write!(buf, ",{ts}");
            }
            None => buf.push_str(",NULL"),
        }
        let _ = write!(buf, ",{})", p.skip);
        buf.push_str(
            " ON DUPLICATE KEY UPDATE `unit`=VALUES(`unit`),`restart`=VALUES(`restart`),\
             `pos`=VALUES(`pos`),`commit_ts`=VALUES(`commit_ts`),`skip`=VALUES(`skip`),\
             `updated`=CURRENT_TIMESTAMP(6)",
        );
    }

    fn followed(&mut self, name: &str, table: &TableRef, columns_json: &str, buf: &mut String) {
        buf.push_str(
            "INSERT INTO `sluice`.`columns` (`name`,`table_schema`,`table_name`,`columns`) \
             VALUES (",
        );
        for (i, v) in [name, &table.schema, &table.name, columns_json]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                buf.push(',');
            }
            render::push_text(buf, v);
        }
        buf.push_str(
            ") ON DUPLICATE KEY UPDATE `columns`=VALUES(`columns`),`updated`=CURRENT_TIMESTAMP(6)",
        );
    }
}
