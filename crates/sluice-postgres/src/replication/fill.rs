//! One change's values into the runner's builders: a tuple's values decoded per column, an
//! unchanged out-of-line value (`u`) absent, a value the export's type cannot hold handled by
//! the bad-value policy; and, with `--before-images`, the whole old row of an update or a
//! delete into the `_before` struct.

use super::pgoutput::{Old, Tuple, Value};
use super::stream::malformed;
use super::values::Codec;
use sluice_core::change::{BadValuePolicy, ChangeRows};
use sluice_core::columns::ColumnBuilder;
use sluice_core::table::TableRef;
use sluice_core::{Error, Result};

/// A relation's appending context: its table, decoders and replica identity columns, the
/// bad-value policy, the transaction's position (for messages).
pub(super) struct Filler<'a> {
    pub table: &'a TableRef,
    pub codecs: &'a [Codec],
    /// The replica identity's columns (what a `K` old tuple carries).
    pub identity: &'a [bool],
    pub bad: &'a BadValuePolicy,
    pub pos: &'a str,
}

impl Filler<'_> {
    fn columns_differ(&self, len: usize) -> Error {
        Error::source_transient(format!(
            "{}: a change carries {len} columns where its description has {}",
            self.table,
            self.codecs.len()
        ))
    }

    /// A value of column `name` that cannot be written (`why`) goes by the bad-value policy:
    /// NULL appended to `out`, or the stream's error.
    fn rejected(&self, out: &mut ColumnBuilder, name: &str, why: String) -> Result<()> {
        self.bad
            .handle(&format!("{}.{name}", self.table), self.pos, &why)?;
        out.push_null();
        Ok(())
    }
}

/// Append one change's table columns: `tuple` with whether it is a key-only old tuple, or
/// none (truncate: every column absent).
pub(super) fn fill(
    f: &Filler<'_>,
    rows: &mut ChangeRows,
    tuple: Option<(Tuple<'_>, bool)>,
) -> Result<()> {
    let n = f.codecs.len();
    let Some((tuple, key_only)) = tuple else {
        for i in 0..n {
            rows.columns()[i].push_null();
            rows.absent(i)?;
        }
        return Ok(());
    };
    if tuple.len != n {
        return Err(f.columns_differ(tuple.len));
    }
    for (i, v) in tuple.values().enumerate() {
        let v = v.map_err(malformed)?;
        if key_only && !f.identity[i] {
            append(f, rows, i, Value::Unchanged)?;
        } else {
            append(f, rows, i, v)?;
        }
    }
    Ok(())
}

/// Append a new row whose unchanged out-of-line values (`u`) are taken from `old`, a whole old
/// row (REPLICA IDENTITY FULL), where it has them; without one they are absent, as in
/// [`fill`].
pub(super) fn fill_from(
    f: &Filler<'_>,
    rows: &mut ChangeRows,
    new: Tuple<'_>,
    old: Option<Tuple<'_>>,
) -> Result<()> {
    let Some(old) = old else {
        return fill(f, rows, Some((new, false)));
    };
    let n = f.codecs.len();
    if new.len != n || old.len != n {
        return Err(f.columns_differ(new.len));
    }
    for (i, (v, o)) in new.values().zip(old.values()).enumerate() {
        let (v, o) = (v.map_err(malformed)?, o.map_err(malformed)?);
        let v = match (v, o) {
            (Value::Unchanged, o) if o != Value::Unchanged => o,
            (v, _) => v,
        };
        append(f, rows, i, v)?;
    }
    Ok(())
}

/// The before-image of an update or a delete when the stream writes them: `old`, the old row
/// the server sent, must be whole (REPLICA IDENTITY FULL) — a key-only or missing one means
/// the table's identity changed since the stream started, which stops it with the fix rather
/// than write a change without its old row.
pub(super) fn fill_before(
    f: &Filler<'_>,
    rows: &mut ChangeRows,
    old: Option<(Old, Tuple<'_>)>,
) -> Result<()> {
    if !rows.before_images() {
        return Ok(());
    }
    let Some((Old::Full, old)) = old else {
        return Err(Error::data(format!(
            "{}: a change at position {} arrived without its whole old row, which \
             --before-images writes: the table (or the partition changed) no longer has \
             REPLICA IDENTITY FULL. Run ALTER TABLE … REPLICA IDENTITY FULL on it (on each \
             partition of a partitioned table) and restart the stream from its saved position \
             — the changes logged before that have no old row to give — or stream without \
             --before-images.",
            f.table, f.pos
        )));
    };
    if old.len != f.codecs.len() {
        return Err(f.columns_differ(old.len));
    }
    for (i, v) in old.values().enumerate() {
        let v = v.map_err(malformed)?;
        if !rows.kept(i) {
            before_of(rows)?[i].push_null();
            continue;
        }
        if matches!(v, Value::Unchanged) {
            // REPLICA IDENTITY FULL logs old rows with their out-of-line values read back.
            return Err(Error::source_permanent(format!(
                "{}: the old row of a change at position {} lacks the value of {}, which \
                 --before-images needs; stream without --before-images",
                f.table,
                f.pos,
                rows.column_name(i)
            )));
        }
        if let Err(why) = f.codecs[i].append(&mut before_of(rows)?[i], v) {
            let name = rows.column_name(i).to_string();
            f.rejected(&mut before_of(rows)?[i], &name, why.to_string())?;
        }
    }
    Ok(())
}

/// The old row's builders (the change has one from the first call on).
fn before_of(rows: &mut ChangeRows) -> Result<&mut [ColumnBuilder]> {
    rows.before()
        .ok_or_else(|| Error::internal("before-images without their builders"))
}

/// Append value `v` of column `i` (absent when the server did not send it; NULL when it cannot
/// be written and the policy says so).
fn append(f: &Filler<'_>, rows: &mut ChangeRows, i: usize, v: Value<'_>) -> Result<()> {
    if !rows.kept(i) {
        // Left out by --columns: not decoded, never written.
        rows.columns()[i].push_null();
        return Ok(());
    }
    if matches!(v, Value::Unchanged) {
        rows.columns()[i].push_null();
        return rows.absent(i);
    }
    if let Err(why) = f.codecs[i].append(&mut rows.columns()[i], v) {
        let name = rows.column_name(i).to_string();
        f.rejected(&mut rows.columns()[i], &name, why.to_string())?;
    }
    Ok(())
}
