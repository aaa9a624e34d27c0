//! PostgreSQL's spelling of the apply statements ([`sluice_core::apply::planner`] decides
//! which statements a unit becomes; this file only writes them).
//!
//! Values are SQL literals ([`super::render`]): unknown-typed constants that PostgreSQL reads
//! with the input function of the column they are assigned to or compared with, so a statement
//! needs no parameter types and many statements fit one simple-query message.
//!
//! - inserts: a multi-row `INSERT … VALUES`, one row per line; a row carrying no column is
//!   `INSERT … DEFAULT VALUES`;
//! - a single-row update or delete matches its key (`IS NULL` for a NULL key value); a table
//!   without one matches one row by `ctid = (SELECT ctid … WHERE every carried column … LIMIT
//!   1)`; a column of a type without an equality operator (`json`, geometric types) compares as
//!   text when the source is PostgreSQL (its type on the target is known then);
//! - a batch of updates or deletes by key: `UPDATE … FROM (VALUES …)` and `DELETE … USING
//!   (VALUES …)`. The `VALUES` list starts with a row of typed NULLs, `(NULL::table).column`, so
//!   every literal after it is read with the input function of the target column's own type
//!   (domains, enums, arrays and collations included) without a catalog lookup; its NULL key
//!   matches no row. The rows of a batch share no key, so no target row is matched twice.

use super::render::{Kind, push_literal, push_sql};
use crate::sql::{quote_ident, quote_table};
use sluice_core::apply::planner::{ApplyDialect, Prepared};
use sluice_core::apply::{AppliedPosition, Engine, UnitTable};
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};
use std::fmt::Write;

/// Types without an equality operator: a keyless table's rows compare their text instead.
const NO_EQUALITY: [&str; 9] = [
    "json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle",
];

/// PostgreSQL's apply statements; `scratch` holds a value's text before it is quoted.
#[derive(Default)]
pub(super) struct PgSql {
    scratch: String,
}

/// A unit table's columns as statements name and write them.
pub(super) struct Columns {
    table: String,
    names: Vec<String>,
    kinds: Vec<Kind>,
    /// Compared as text (a type without equality, known from a PostgreSQL source).
    text_compare: Vec<bool>,
}

type P<'a> = Prepared<'a, Columns>;

impl PgSql {
    /// `col = 'v'` (or `IS NULL`) for each of `cols` of row `r`, joined by `AND`.
    fn conditions(&mut self, p: &P<'_>, cols: &[usize], r: usize, buf: &mut String) -> Result<()> {
        if cols.is_empty() {
            buf.push_str("true");
        }
        for (n, &c) in cols.iter().enumerate() {
            if n > 0 {
                buf.push_str(" AND ");
            }
            let name = &p.cols.names[c];
            if p.t.batch.column(c).is_null(r) {
                let _ = write!(buf, "{name} IS NULL");
                continue;
            }
            if p.cols.text_compare[c] {
                let _ = write!(buf, "{name}::text = ");
            } else {
                let _ = write!(buf, "{name} = ");
            }
            self.value(p, c, r, buf)?;
        }
        Ok(())
    }

    /// `(VALUES (typed NULLs), (row), …) AS _v(cols)` of columns `cols` for `rows`.
    fn values(
        &mut self,
        p: &P<'_>,
        cols: &[usize],
        rows: &[usize],
        buf: &mut String,
    ) -> Result<()> {
        buf.push_str("(VALUES (");
        for (n, &c) in cols.iter().enumerate() {
            if n > 0 {
                buf.push_str(", ");
            }
            let _ = write!(buf, "(NULL::{}).{}", p.cols.table, p.cols.names[c]);
        }
        buf.push(')');
        for &r in rows {
            buf.push_str(", (");
            for (n, &c) in cols.iter().enumerate() {
                if n > 0 {
                    buf.push_str(", ");
                }
                self.value(p, c, r, buf)?;
            }
            buf.push(')');
        }
        buf.push_str(") AS _v(");
        push_names(p, cols, buf);
        buf.push(')');
        Ok(())
    }
}

/// The quoted names of `cols`, separated by `, `.
fn push_names(p: &P<'_>, cols: &[usize], buf: &mut String) {
    for (n, &c) in cols.iter().enumerate() {
        if n > 0 {
            buf.push_str(", ");
        }
        buf.push_str(&p.cols.names[c]);
    }
}

/// ` WHERE _t.k = _v.k AND …` over the key.
fn key_join(p: &P<'_>, buf: &mut String) {
    buf.push_str(" WHERE ");
    for (n, &k) in p.key.iter().enumerate() {
        if n > 0 {
            buf.push_str(" AND ");
        }
        let _ = write!(buf, "_t.{k} = _v.{k}", k = p.cols.names[k]);
    }
}

impl ApplyDialect for PgSql {
    type Columns = Columns;

    const UPDATE_ROWS: usize = 1000;
    const DELETE_ROWS: usize = 1000;
    const END: &'static str = ";\n";
    const ROW_SEP: &'static str = ",\n";
    const BEGIN: &'static str = "BEGIN";
    const COMMIT: &'static str = "COMMIT";
    const LIST_SEP: &'static str = ", ";
    const VALUES_SEP: &'static str = "\n";

    fn columns(&self, t: &UnitTable) -> Result<Columns> {
        let same_engine = t.source_engine == Engine::Postgres;
        let mut kinds = Vec::with_capacity(t.columns.len());
        for (c, f) in t.columns.iter().zip(t.batch.schema().fields().iter()) {
            kinds
                .push(Kind::of(f).map_err(|e| {
                    Error::data(format!("{}.{}: {}", t.table, c.name, e.message()))
                })?);
        }
        Ok(Columns {
            table: quote_table(&t.table),
            names: t.columns.iter().map(|c| quote_ident(&c.name)).collect(),
            kinds,
            text_compare: t
                .columns
                .iter()
                .map(|c| same_engine && NO_EQUALITY.contains(&c.source_type.trim_end_matches("[]")))
                .collect(),
        })
    }

    fn table<'a>(p: &'a P<'_>) -> &'a str {
        &p.cols.table
    }

    fn name<'a>(p: &'a P<'_>, c: usize) -> &'a str {
        &p.cols.names[c]
    }

    fn value(&mut self, p: &P<'_>, c: usize, r: usize, buf: &mut String) -> Result<()> {
        let a = p.t.batch.column(c).as_ref();
        push_sql(&p.cols.kinds[c], a, r, &mut self.scratch, buf)
    }

    fn default_values(&mut self, p: &P<'_>) -> Option<String> {
        Some(format!("INSERT INTO {} DEFAULT VALUES", p.cols.table))
    }

    fn update_head(&mut self, p: &P<'_>, set: &[usize], r: usize, buf: &mut String) -> Result<()> {
        let _ = write!(buf, "UPDATE {} SET ", p.cols.table);
        for (n, &c) in set.iter().enumerate() {
            if n > 0 {
                buf.push_str(", ");
            }
            let _ = write!(buf, "{} = ", p.cols.names[c]);
            self.value(p, c, r, buf)?;
        }
        Ok(())
    }

    fn delete_head(&mut self, p: &P<'_>, buf: &mut String) {
        let _ = write!(buf, "DELETE FROM {}", p.cols.table);
    }

    fn row_where(&mut self, p: &P<'_>, cols: &[usize], r: usize, buf: &mut String) -> Result<()> {
        if !p.key.is_empty() {
            buf.push_str(" WHERE ");
            return self.conditions(p, cols, r, buf);
        }
        let _ = write!(
            buf,
            " WHERE ctid = (SELECT ctid FROM {} WHERE ",
            p.cols.table
        );
        self.conditions(p, cols, r, buf)?;
        buf.push_str(" LIMIT 1)");
        Ok(())
    }

    fn update_many(
        &mut self,
        p: &P<'_>,
        set: &[usize],
        rows: &[usize],
        buf: &mut String,
    ) -> Result<()> {
        let _ = write!(buf, "UPDATE {} AS _t SET ", p.cols.table);
        for (n, &c) in set.iter().enumerate() {
            if n > 0 {
                buf.push_str(", ");
            }
            let _ = write!(buf, "{c} = _v.{c}", c = p.cols.names[c]);
        }
        buf.push_str(" FROM ");
        let cols: Vec<usize> = p.key.iter().chain(set).copied().collect();
        self.values(p, &cols, rows, buf)?;
        key_join(p, buf);
        Ok(())
    }

    fn delete_many(&mut self, p: &P<'_>, rows: &[usize], buf: &mut String) -> Result<()> {
        let _ = write!(buf, "DELETE FROM {} AS _t USING ", p.cols.table);
        self.values(p, &p.key, rows, buf)?;
        key_join(p, buf);
        Ok(())
    }

    fn position(&mut self, name: &str, worker: u32, p: &AppliedPosition, buf: &mut String) {
        buf.push_str(
            "INSERT INTO sluice.applied (name, worker, unit, restart, pos, commit_ts, skip) \
             VALUES (",
        );
        push_literal(name, buf);
        let _ = write!(buf, ", {worker}, {}, ", p.unit);
        push_literal(p.restart.as_str(), buf);
        buf.push_str(", ");
        push_literal(p.pos.as_str(), buf);
        match p.commit_ts {
            Some(ts) => {
                let _ = write!(buf, ", {ts}");
            }
            None => buf.push_str(", NULL"),
        }
        let _ = write!(buf, ", {})", p.skip);
        buf.push_str(
            " ON CONFLICT (name, worker) DO UPDATE SET unit = excluded.unit, restart = \
             excluded.restart, pos = excluded.pos, commit_ts = excluded.commit_ts, \
             skip = excluded.skip, updated_at = now()",
        );
    }

    fn followed(&mut self, name: &str, table: &TableRef, columns_json: &str, buf: &mut String) {
        buf.push_str(
            "INSERT INTO sluice.columns (name, table_schema, table_name, columns) VALUES (",
        );
        for (i, v) in [name, &table.schema, &table.name, columns_json]
            .into_iter()
            .enumerate()
        {
            if i > 0 {
                buf.push_str(", ");
            }
            push_literal(v, buf);
        }
        buf.push_str(
            ") ON CONFLICT (name, table_schema, table_name) DO UPDATE SET columns = \
             excluded.columns, updated_at = now()",
        );
    }
}
