//! Many rows of one table in one statement: an `UPDATE … FROM (VALUES …)` and a `DELETE …
//! USING (VALUES …)` for a batch of updates or deletes by key (see `sluice_core::apply::
//! ApplyUnit::batches`), besides the table's columns prepared for rendering.
//!
//! The `VALUES` list starts with a row of typed NULLs, `(NULL::table).column`, so every
//! literal after it is read with the input function of the target column's own type (domains,
//! enums, arrays and collations included) without a catalog lookup; its NULL key matches no
//! row. The rows of a batch share no key, so no target row is matched twice.

use super::render::{Kind, push_sql};
use crate::sql::{quote_ident, quote_table};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, GenericListArray, StringArray};
use sluice_core::apply::UnitTable;
use sluice_core::change::{ABSENT, OP};
use sluice_core::{Error, Result};

/// Types without an equality operator: a keyless table's rows compare their text instead.
const NO_EQUALITY: [&str; 9] = [
    "json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle",
];

/// Rows of one statement at most (a batch larger than this is split).
pub(super) const STATEMENT_ROWS: usize = 1000;

/// A unit table's columns prepared for rendering.
pub(super) struct Prepared<'a> {
    pub(super) t: &'a UnitTable,
    pub(super) table: String,
    pub(super) names: Vec<String>,
    pub(super) kinds: Vec<Kind>,
    pub(super) text_compare: Vec<bool>,
    pub(super) key: Vec<usize>,
    pub(super) op: &'a StringArray,
    pub(super) absent: &'a GenericListArray<i32>,
}

impl<'a> Prepared<'a> {
    /// `same_engine`: the columns have their source types on the target (a PostgreSQL source),
    /// so the types without equality are known by name.
    pub(super) fn new(t: &'a UnitTable, same_engine: bool) -> Result<Self> {
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
    pub(super) fn absent(&self, r: usize, mask: &mut Vec<bool>) {
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

/// `(NULL::table)."c"` for each column `cols` of `p`, the typed first row of a `VALUES` list.
fn typed_nulls(p: &Prepared<'_>, cols: &[usize], buf: &mut String) {
    buf.push('(');
    for (n, &c) in cols.iter().enumerate() {
        if n > 0 {
            buf.push_str(", ");
        }
        buf.push_str("(NULL::");
        buf.push_str(&p.table);
        buf.push_str(").");
        buf.push_str(&p.names[c]);
    }
    buf.push(')');
}

/// `VALUES (typed NULLs), (row), …` of columns `cols` for `rows`, then `AS _v(cols)`.
fn values(
    p: &Prepared<'_>,
    cols: &[usize],
    rows: &[usize],
    scratch: &mut String,
    buf: &mut String,
) -> Result<()> {
    buf.push_str("(VALUES ");
    typed_nulls(p, cols, buf);
    for &r in rows {
        buf.push_str(", (");
        for (n, &c) in cols.iter().enumerate() {
            if n > 0 {
                buf.push_str(", ");
            }
            push_sql(&p.kinds[c], p.t.batch.column(c).as_ref(), r, scratch, buf)?;
        }
        buf.push(')');
    }
    buf.push_str(") AS _v(");
    for (n, &c) in cols.iter().enumerate() {
        if n > 0 {
            buf.push_str(", ");
        }
        buf.push_str(&p.names[c]);
    }
    buf.push(')');
    Ok(())
}

/// ` WHERE _t.k = _v.k AND …` over the key.
fn key_join(p: &Prepared<'_>, buf: &mut String) {
    buf.push_str(" WHERE ");
    for (n, &k) in p.key.iter().enumerate() {
        if n > 0 {
            buf.push_str(" AND ");
        }
        buf.push_str("_t.");
        buf.push_str(&p.names[k]);
        buf.push_str(" = _v.");
        buf.push_str(&p.names[k]);
    }
}

/// One `UPDATE` of `rows` (updates of a keyed table that share no key, each carrying the
/// columns `absent` does not mark); `false` when there is nothing to set.
pub(super) fn update(
    p: &Prepared<'_>,
    rows: &[usize],
    absent: &[bool],
    scratch: &mut String,
    buf: &mut String,
) -> Result<bool> {
    let set: Vec<usize> = (0..p.names.len())
        .filter(|i| !absent[*i] && !p.key.contains(i))
        .collect();
    if set.is_empty() {
        return Ok(false);
    }
    buf.push_str("UPDATE ");
    buf.push_str(&p.table);
    buf.push_str(" AS _t SET ");
    for (n, &c) in set.iter().enumerate() {
        if n > 0 {
            buf.push_str(", ");
        }
        buf.push_str(&p.names[c]);
        buf.push_str(" = _v.");
        buf.push_str(&p.names[c]);
    }
    buf.push_str(" FROM ");
    let cols: Vec<usize> = p.key.iter().copied().chain(set).collect();
    values(p, &cols, rows, scratch, buf)?;
    key_join(p, buf);
    buf.push_str(";\n");
    Ok(true)
}

/// One `DELETE` of `rows` (deletes of a keyed table), matched by key.
pub(super) fn delete(
    p: &Prepared<'_>,
    rows: &[usize],
    scratch: &mut String,
    buf: &mut String,
) -> Result<()> {
    buf.push_str("DELETE FROM ");
    buf.push_str(&p.table);
    buf.push_str(" AS _t USING ");
    values(p, &p.key, rows, scratch, buf)?;
    key_join(p, buf);
    buf.push_str(";\n");
    Ok(())
}
