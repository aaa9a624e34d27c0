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
use arrow_array::Array;
use sluice_core::Result;
use sluice_core::apply::UnitTable;
use sluice_core::apply::planner::{ApplyDialect, Many, Prepared, push_list, try_list};
use std::fmt::Write;

/// MySQL/MariaDB's apply statements.
pub(super) struct MySql {
    /// MySQL (not MariaDB): JSON columns compare with `CAST(… AS JSON)`.
    pub(super) mysql_json: bool,
}

/// Per column of a unit table: how its values are written.
type P<'a> = Prepared<'a, Vec<Kind>>;

/// Row `r`'s value of column `c` as a literal written as `kind`.
fn value(p: &P<'_>, kind: Kind, c: usize, r: usize, buf: &mut String) -> Result<()> {
    render::value(buf, kind, p.t.batch.column(c), r, &p.t.columns[c].name)
}

/// The condition that row `r` of `p` matches by its key: `(k1 = v1 AND k2 = v2)`.
fn key_match(p: &P<'_>, r: usize, buf: &mut String) -> Result<()> {
    buf.push('(');
    try_list(buf, " AND ", &p.key, |buf, &k| {
        let _ = write!(buf, "{} = ", p.names[k]);
        value(p, p.cols[k], k, r, buf)
    })?;
    buf.push(')');
    Ok(())
}

/// ` WHERE k IN (v1, v2, …)`, or `(k1 = … AND k2 = …) OR …` for a composite key.
fn key_where(p: &P<'_>, rows: &[usize], buf: &mut String) -> Result<()> {
    buf.push_str(" WHERE ");
    if let [k] = p.key[..] {
        let _ = write!(buf, "{} IN (", p.names[k]);
        try_list(buf, ",", rows, |buf, &r| value(p, p.cols[k], k, r, buf))?;
        buf.push(')');
        return Ok(());
    }
    try_list(buf, " OR ", rows, |buf, &r| key_match(p, r, buf))
}

impl ApplyDialect for MySql {
    type Columns = Vec<Kind>;

    const QUOTE: char = '`';
    const UPDATE_ROWS: usize = 200;
    const BEGIN: &'static str = "START TRANSACTION";

    fn columns(&self, t: &UnitTable) -> Result<Vec<Kind>> {
        Ok(t.columns.iter().map(|c| Kind::of(&c.field)).collect())
    }

    fn value(&mut self, p: &P<'_>, c: usize, r: usize, buf: &mut String) -> Result<()> {
        value(p, p.cols[c], c, r, buf)
    }

    fn text(&mut self, text: &str, buf: &mut String) {
        render::push_text(buf, text);
    }

    fn on_conflict(&mut self, _key: &[&str], set: &[&str], buf: &mut String) {
        buf.push_str(" ON DUPLICATE KEY UPDATE ");
        push_list(buf, ",", set, |buf, c| {
            let _ = write!(buf, "{c}=VALUES({c})");
        });
        buf.push_str(",`updated`=CURRENT_TIMESTAMP(6)");
    }

    fn default_values(&mut self, _p: &P<'_>) -> Option<String> {
        None
    }

    fn row_where(&mut self, p: &P<'_>, cols: &[usize], r: usize, buf: &mut String) -> Result<()> {
        let keyless = p.key.is_empty();
        buf.push_str(" WHERE ");
        try_list(buf, " AND ", cols, |buf, &c| {
            let (name, kind) = (&p.names[c], p.cols[c]);
            if kind == Kind::Wkb {
                let _ = write!(buf, "ST_AsBinary({name}) <=> ");
                return value(p, Kind::Plain, c, r, buf);
            }
            buf.push_str(name);
            if p.t.batch.column(c).is_null(r) {
                buf.push_str(" IS NULL");
                return Ok(());
            }
            buf.push_str(if keyless { " <=> " } else { " = " });
            let json = kind == Kind::Json && self.mysql_json;
            if json {
                buf.push_str("CAST(");
            }
            value(p, kind, c, r, buf)?;
            if json {
                buf.push_str(" AS JSON)");
            }
            Ok(())
        })?;
        if keyless {
            buf.push_str(" LIMIT 1");
        }
        Ok(())
    }

    fn update_many(&mut self, p: &P<'_>, many: Many<'_>, buf: &mut String) -> Result<()> {
        let _ = write!(buf, "UPDATE {} SET ", p.table);
        try_list(buf, ",", many.set, |buf, &c| {
            let _ = write!(buf, "{}=CASE", p.names[c]);
            for &r in many.rows {
                buf.push_str(" WHEN ");
                key_match(p, r, buf)?;
                buf.push_str(" THEN ");
                value(p, p.cols[c], c, r, buf)?;
            }
            buf.push_str(" END");
            Ok(())
        })?;
        key_where(p, many.rows, buf)
    }

    fn delete_many(&mut self, p: &P<'_>, many: Many<'_>, buf: &mut String) -> Result<()> {
        let _ = write!(buf, "DELETE FROM {}", p.table);
        key_where(p, many.rows, buf)
    }
}
