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
use sluice_core::apply::planner::{ApplyDialect, Many, Prepared, push_list, try_list};
use sluice_core::apply::{Engine, UnitTable};
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

/// A unit table's columns as statements write them.
pub(super) struct Columns {
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
        try_list(buf, " AND ", cols, |buf, &c| {
            let name = &p.names[c];
            if p.t.batch.column(c).is_null(r) {
                let _ = write!(buf, "{name} IS NULL");
                return Ok(());
            }
            let cast = if p.cols.text_compare[c] { "::text" } else { "" };
            let _ = write!(buf, "{name}{cast} = ");
            self.value(p, c, r, buf)
        })
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
        push_list(buf, ", ", cols, |buf, &c| {
            let _ = write!(buf, "(NULL::{}).{}", p.table, p.names[c]);
        });
        buf.push(')');
        for &r in rows {
            buf.push_str(", (");
            try_list(buf, ", ", cols, |buf, &c| self.value(p, c, r, buf))?;
            buf.push(')');
        }
        buf.push_str(") AS _v(");
        push_list(buf, ", ", cols, |buf, &c| buf.push_str(&p.names[c]));
        buf.push(')');
        Ok(())
    }
}

/// ` WHERE _t.k = _v.k AND …` over the key.
fn key_join(p: &P<'_>, buf: &mut String) {
    buf.push_str(" WHERE ");
    push_list(buf, " AND ", &p.key, |buf, &k| {
        let _ = write!(buf, "_t.{k} = _v.{k}", k = p.names[k]);
    });
}

impl ApplyDialect for PgSql {
    type Columns = Columns;

    const QUOTE: char = '"';
    const END: &'static str = ";\n";
    const ROW_SEP: &'static str = ",\n";
    const LIST_SEP: &'static str = ", ";
    const VALUES_SEP: &'static str = "\n";
    const ASSIGN: &'static str = " = ";

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
            kinds,
            text_compare: t
                .columns
                .iter()
                .map(|c| same_engine && NO_EQUALITY.contains(&c.source_type.trim_end_matches("[]")))
                .collect(),
        })
    }

    fn value(&mut self, p: &P<'_>, c: usize, r: usize, buf: &mut String) -> Result<()> {
        let a = p.t.batch.column(c).as_ref();
        push_sql(&p.cols.kinds[c], a, r, &mut self.scratch, buf)
    }

    fn text(&mut self, text: &str, buf: &mut String) {
        push_literal(text, buf);
    }

    fn on_conflict(&mut self, key: &[&str], set: &[&str], buf: &mut String) {
        buf.push_str(" ON CONFLICT (");
        push_list(buf, ", ", key, |buf, k| buf.push_str(k));
        buf.push_str(") DO UPDATE SET ");
        for c in set {
            let _ = write!(buf, "{c} = excluded.{c}, ");
        }
        buf.push_str("updated_at = now()");
    }

    fn default_values(&mut self, p: &P<'_>) -> Option<String> {
        Some(format!("INSERT INTO {} DEFAULT VALUES", p.table))
    }

    fn row_where(&mut self, p: &P<'_>, cols: &[usize], r: usize, buf: &mut String) -> Result<()> {
        if !p.key.is_empty() {
            buf.push_str(" WHERE ");
            return self.conditions(p, cols, r, buf);
        }
        let _ = write!(buf, " WHERE ctid = (SELECT ctid FROM {} WHERE ", p.table);
        self.conditions(p, cols, r, buf)?;
        buf.push_str(" LIMIT 1)");
        Ok(())
    }

    fn update_many(&mut self, p: &P<'_>, many: Many<'_>, buf: &mut String) -> Result<()> {
        let _ = write!(buf, "UPDATE {} AS _t SET ", p.table);
        push_list(buf, ", ", many.set, |buf, &c| {
            let _ = write!(buf, "{c} = _v.{c}", c = p.names[c]);
        });
        buf.push_str(" FROM ");
        let cols: Vec<usize> = p.key.iter().chain(many.set).copied().collect();
        self.values(p, &cols, many.rows, buf)?;
        key_join(p, buf);
        Ok(())
    }

    fn delete_many(&mut self, p: &P<'_>, many: Many<'_>, buf: &mut String) -> Result<()> {
        let _ = write!(buf, "DELETE FROM {} AS _t USING ", p.table);
        self.values(p, &p.key, many.rows, buf)?;
        key_join(p, buf);
        Ok(())
    }
}
