//! Many rows of one table in one statement: an `UPDATE … SET c = CASE … END WHERE key IN (…)`
//! and a `DELETE … WHERE key IN (…)` for a batch of updates or deletes by key (see
//! `sluice_core::apply::ApplyUnit::batches`), besides a unit table prepared for rendering.
//!
//! Why `CASE` and not a join with a derived table of the values (measured a little faster on
//! MariaDB): every comparison stays a column against a literal, as in a one-row statement, so
//! the column's collation decides it; a derived table's text columns carry a collation of
//! their own, which MySQL may refuse to mix with the column's. `CASE` is linear in the rows
//! of the statement for every row it updates, so an update statement holds at most
//! [`UPDATE_ROWS`] rows. The rows of a batch share no key, so no row is matched twice.

use super::render::{self, Kind};
use crate::sql::{quote_ident, quote_table};
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, ListArray, StringArray};
use sluice_core::apply::UnitTable;
use sluice_core::change::{ABSENT, OP};
use sluice_core::{Error, Result};

/// Rows of one `UPDATE` at most.
pub(super) const UPDATE_ROWS: usize = 200;
/// Rows of one `DELETE` at most.
pub(super) const DELETE_ROWS: usize = 1000;

/// One table of a unit, ready to render rows.
pub(super) struct Prepared<'a> {
    pub(super) t: &'a UnitTable,
    pub(super) name: String,
    pub(super) cols: Vec<(String, Kind, &'a ArrayRef)>,
    pub(super) op: &'a StringArray,
    pub(super) absent: &'a ListArray,
    pub(super) key: Vec<usize>,
}

impl<'a> Prepared<'a> {
    pub(super) fn new(t: &'a UnitTable) -> Result<Self> {
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
        let key = t.key_positions()?;
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
    pub(super) fn present(&self, r: usize) -> Vec<bool> {
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

/// The condition that row `r` of `p` matches by its key: `k = v` for a one-column key (as the
/// caller writes an `IN` list), `(k1 = v1 AND k2 = v2)` otherwise.
fn key_match(p: &Prepared<'_>, r: usize, buf: &mut String) -> Result<()> {
    buf.push('(');
    for (n, &k) in p.key.iter().enumerate() {
        if n > 0 {
            buf.push_str(" AND ");
        }
        let (name, kind, array) = &p.cols[k];
        buf.push_str(name);
        buf.push_str(" = ");
        render::value(buf, *kind, array, r, &p.t.columns[k].name)?;
    }
    buf.push(')');
    Ok(())
}

/// ` WHERE k IN (v1, v2, …)`, or `(k1 = … AND k2 = …) OR …` for a composite key.
fn key_where(p: &Prepared<'_>, rows: &[usize], buf: &mut String) -> Result<()> {
    buf.push_str(" WHERE ");
    if let [k] = p.key[..] {
        let (name, kind, array) = &p.cols[k];
        buf.push_str(name);
        buf.push_str(" IN (");
        for (n, &r) in rows.iter().enumerate() {
            if n > 0 {
                buf.push(',');
            }
            render::value(buf, *kind, array, r, &p.t.columns[k].name)?;
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

/// One `UPDATE` of `rows` (updates of a keyed table that share no key, each carrying the
/// columns `present` marks); `false` when there is nothing to set.
pub(super) fn update(
    p: &Prepared<'_>,
    rows: &[usize],
    present: &[bool],
    buf: &mut String,
) -> Result<bool> {
    let set: Vec<usize> = (0..p.cols.len())
        .filter(|i| present[*i] && !p.key.contains(i))
        .collect();
    if set.is_empty() {
        return Ok(false);
    }
    buf.push_str("UPDATE ");
    buf.push_str(&p.name);
    buf.push_str(" SET ");
    for (n, &c) in set.iter().enumerate() {
        if n > 0 {
            buf.push(',');
        }
        let (name, kind, array) = &p.cols[c];
        buf.push_str(name);
        buf.push_str("=CASE");
        for &r in rows {
            buf.push_str(" WHEN ");
            key_match(p, r, buf)?;
            buf.push_str(" THEN ");
            render::value(buf, *kind, array, r, &p.t.columns[c].name)?;
        }
        buf.push_str(" END");
    }
    key_where(p, rows, buf)?;
    buf.push(';');
    Ok(true)
}

/// One `DELETE` of `rows` (deletes of a keyed table), matched by key.
pub(super) fn delete(p: &Prepared<'_>, rows: &[usize], buf: &mut String) -> Result<()> {
    buf.push_str("DELETE FROM ");
    buf.push_str(&p.name);
    key_where(p, rows, buf)?;
    buf.push(';');
    Ok(())
}
